//! The shape of `src/` and of the library crates under `crates/`, checked: the top-level units (folders and files) import each other
//! without cycles, the files inside a unit import each other without cycles, only the command
//! line uses clap, no source file holds more than [`MAX_LINES`] lines before its unit tests,
//! and no function there runs over [`MAX_FN_LINES`] lines. ARCHITECTURE.md describes the
//! layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Imports between top-level units allowed although they close a cycle: none.
const ALLOWED: &[(&str, &str)] = &[];

/// The root crate's test-only fixture (`tests/common/claims.rs`, included by `src/lib.rs` under
/// `#[cfg(test)]`): every unit's tests may use it, and it uses only the ledger's types.
const TEST_FIXTURE: &str = "test_claims";

/// Imports between files of one unit allowed although they close a cycle, as (from, to):
/// none.
const ALLOWED_FILE_IMPORTS: &[(&str, &str)] = &[];

/// Functions allowed over [`MAX_FN_LINES`], as (file under `src/`, function): none.
const ALLOWED_LONG_FNS: &[(&str, &str)] = &[];

/// The units from the bottom up, as ARCHITECTURE.md lists them: each imports only units before
/// it (a stricter rule than "no cycle", and the one a reader of the folders relies on).
const ORDER: &[&str] = &[
    "ledger",
    "ipam",
    "admission",
    "metrics",
    "decisions",
    "cluster",
    "server",
    "ops",
    "app",
    "cli",
];

/// Lines a source file may hold before its `#[cfg(test)]` unit tests.
const MAX_LINES: usize = 700;

/// Lines a function may run over, from its `fn` line to its closing brace, before the unit
/// tests: a longer one decides more than one thing, and each part gets a name.
const MAX_FN_LINES: usize = 80;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The workspace's library crates below `ip-webhook`, each one unit of [`ORDER`]: the folder
/// under `crates/` and the name its users import.
const CRATES: &[(&str, &str)] = &[
    ("ledger", "ip_webhook_ledger"),
    ("ipam", "ip_webhook_ipam"),
    ("admission", "ip_webhook_admission"),
];

/// Every source file of the workspace as (unit, path, text). A crate of [`CRATES`] is read as
/// if its `src/` were the folder of its unit under `src/` (`lib.rs` as `mod.rs`), and names
/// are rewritten to match: its `crate::x` is `crate::<unit>::x`, and every file's
/// `ip_webhook_<unit>` is `crate::<unit>`. The checks below then read one tree.
fn src_files() -> Vec<(String, PathBuf, String)> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut roots = vec![(manifest.join("src"), None)];
    for (unit, _) in CRATES {
        roots.push((manifest.join("crates").join(unit).join("src"), Some(*unit)));
    }
    let mut out = Vec::new();
    for (root, crate_unit) in roots {
        let mut files = Vec::new();
        sources(&root, &mut files);
        files.sort();
        for path in files {
            let inner = path.strip_prefix(&root).unwrap().to_path_buf();
            let mut text = std::fs::read_to_string(&path).expect("reading a source file");
            let relative = match crate_unit {
                Some(unit) => {
                    text = text.replace("crate::", &format!("crate::{unit}::"));
                    let inner = if inner == Path::new("lib.rs") {
                        PathBuf::from("mod.rs")
                    } else {
                        inner
                    };
                    Path::new(unit).join(inner)
                }
                None => inner,
            };
            for (unit, name) in CRATES {
                text = text.replace(name, &format!("crate::{unit}"));
            }
            let first = relative.components().next().unwrap();
            let unit = first.as_os_str().to_string_lossy();
            let unit = unit.strip_suffix(".rs").unwrap_or(&unit).to_string();
            out.push((unit, relative, text));
        }
    }
    out
}

/// The code of a file without its comments (doc links are not imports).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level units `code` names as `crate::unit`, including `crate::{a, b::c}`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = code[at + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name = ident(part.trim());
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.insert(name);
            }
        }
    }
    found
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (unit, _, text) in src_files() {
        if unit == "main" || unit == "lib" {
            continue;
        }
        let entry = graph.entry(unit.clone()).or_default();
        for used in imports(&code(&text)) {
            if used != unit
                && used != TEST_FIXTURE
                && !ALLOWED.contains(&(unit.as_str(), used.as_str()))
            {
                entry.insert(used);
            }
        }
    }
    graph
}

/// A cycle of `graph` as `a -> b -> a`, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| n == node).unwrap();
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_top_level_units_import_each_other_without_a_cycle() {
    let graph = graph();
    assert!(
        graph.contains_key("decisions") && graph.contains_key("ledger"),
        "{graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle between the folders of src/: {}\nthe graph: {graph:#?}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn every_unit_imports_only_the_layers_below_it() {
    let graph = graph();
    let mut wrong = Vec::new();
    for (unit, uses) in &graph {
        let Some(at) = ORDER.iter().position(|u| u == unit) else {
            wrong.push(format!(
                "{unit} is not in ORDER (tests/layers.rs, ARCHITECTURE.md)"
            ));
            continue;
        };
        for used in uses {
            match ORDER.iter().position(|u| u == used) {
                Some(below) if below < at => {}
                _ => wrong.push(format!("{unit} imports {used}, which is not below it")),
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_cycle_finder_names_a_cycle() {
    let mut graph = BTreeMap::new();
    let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    graph.insert("a".to_string(), set(&["b"]));
    graph.insert("b".to_string(), set(&["c"]));
    graph.insert("c".to_string(), set(&["a"]));
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    graph.insert("c".to_string(), set(&[]));
    assert_eq!(find_cycle(&graph), None);
    assert_eq!(
        imports(&code(
            "use crate::{x, y::Z};\nlet a = crate::w::f(); // crate::comment\n"
        )),
        set(&["w", "x", "y"])
    );
}

#[test]
fn at_most_a_dozen_top_level_units() {
    // lib.rs and main.rs are the crate's roots, not units
    let units: BTreeSet<String> = src_files()
        .into_iter()
        .map(|(unit, _, _)| unit)
        .filter(|unit| unit != "lib" && unit != "main")
        .collect();
    assert!(
        units.len() <= 12,
        "{} units under src/: {units:?}",
        units.len()
    );
}

#[test]
fn only_the_command_line_uses_clap() {
    let users: Vec<PathBuf> = src_files()
        .into_iter()
        .filter(|(unit, _, text)| unit != "main" && unit != "cli" && code(text).contains("clap"))
        .map(|(_, path, _)| path)
        .collect();
    assert!(
        users.is_empty(),
        "clap used outside main.rs and cli/: {users:?}"
    );
}

#[test]
fn no_source_file_is_over_the_limit_before_its_unit_tests() {
    let over: Vec<(PathBuf, usize)> = src_files()
        .into_iter()
        .filter_map(|(_, path, text)| {
            // the unit-test module, not any `#[cfg(test)]` item (a test-only constant above
            // it would otherwise exempt the rest of the file)
            let lines: Vec<&str> = text.lines().collect();
            let lines = lines
                .windows(2)
                .position(|pair| {
                    pair[0].starts_with("#[cfg(test)]") && pair[1].starts_with("mod tests")
                })
                .unwrap_or(lines.len());
            (lines > MAX_LINES).then_some((path, lines))
        })
        .collect();
    assert!(
        over.is_empty(),
        "over {MAX_LINES} lines before the unit tests: {over:?}"
    );
}

/// The code of a file above its unit-test module (what the program, not its tests, imports).
fn before_unit_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|pair| pair[0].starts_with("#[cfg(test)]") && pair[1].starts_with("mod tests"))
        .unwrap_or(lines.len());
    lines[..end].join("\n")
}

/// The module path of a source file: `cluster/index.rs` and `cluster/index/mod.rs` are
/// `["cluster", "index"]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The paths `code` names from `super::`, `self::` or `crate::`, each resolved against
/// `module` (the file's module path) to absolute segments; a `{a, b::c}` group gives one path
/// per member (its first segment after the group is enough to find the file).
fn module_uses(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let starts_word = at == 0
            || !(bytes[at - 1].is_ascii_alphanumeric()
                || bytes[at - 1] == b'_'
                || bytes[at - 1] == b':');
        let root = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|root| starts_word && rest.starts_with(root));
        let Some(root) = root else {
            at += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let mut base: Vec<String> = match root {
            "crate::" => Vec::new(),
            "super::" => module[..module.len().saturating_sub(1)].to_vec(),
            _ => module.to_vec(),
        };
        let mut tail = &rest[root.len()..];
        while let Some(more) = tail.strip_prefix("super::") {
            base.pop();
            tail = more;
        }
        loop {
            let tail_trim = tail.trim_start();
            if let Some(group) = tail_trim.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    let name = ident(part.trim());
                    if !name.is_empty() && name != "self" {
                        let mut path = base.clone();
                        path.push(name);
                        found.push(path);
                    }
                }
                found.push(base.clone());
                break;
            }
            let name = ident(tail_trim);
            if name.is_empty() {
                found.push(base.clone());
                break;
            }
            base.push(name.clone());
            match tail_trim[name.len()..].strip_prefix("::") {
                Some(more) => tail = more,
                None => {
                    found.push(base.clone());
                    break;
                }
            }
        }
        at += root.len();
    }
    found
}

/// For each top-level unit, the imports between its files: file -> files it names, where a
/// path names the deepest file module it starts with. A file naming its own ancestor module
/// (a child reading what its parent shares) or its descendant (a parent wiring its children)
/// is the module tree, not an import between peers, and is left out.
fn file_graphs(allowed: &[(&str, &str)]) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let files: Vec<(String, Vec<String>, String)> = src_files()
        .into_iter()
        .filter(|(unit, _, _)| unit != "main" && unit != "lib")
        .map(|(unit, path, text)| (unit, module_path(&path), code(&before_unit_tests(&text))))
        .collect();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(_, m, _)| m.clone()).collect();
    let mut graphs: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (unit, module, code) in &files {
        let entry = graphs
            .entry(unit.clone())
            .or_default()
            .entry(module.join("::"))
            .or_default();
        for path in module_uses(code, module) {
            let Some(target) = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|prefix| modules.contains(prefix))
            else {
                continue;
            };
            let same_unit = target.first() == Some(unit);
            let lineal = target.starts_with(module) || module.starts_with(&target);
            let target = target.join("::");
            let exempt = allowed.contains(&(module.join("::").as_str(), target.as_str()));
            if same_unit && !lineal && !exempt {
                entry.insert(target);
            }
        }
    }
    graphs
}

#[test]
fn the_files_inside_a_unit_import_each_other_without_a_cycle() {
    let graphs = file_graphs(ALLOWED_FILE_IMPORTS);
    let cluster = &graphs["cluster"];
    assert!(
        cluster["cluster::node_loss"].contains("cluster::index"),
        "{cluster:#?}"
    );
    let cycles: Vec<String> = graphs
        .values()
        .filter_map(find_cycle)
        .map(|cycle| cycle.join(" -> "))
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles between the files of a unit (move what both need to its own file): {cycles:#?}"
    );
    let all = file_graphs(&[]);
    for (from, to) in ALLOWED_FILE_IMPORTS {
        let unit = from.split("::").next().unwrap();
        assert!(
            all[unit].get(*from).is_some_and(|uses| uses.contains(*to)),
            "{from} no longer imports {to}: remove the entry from ALLOWED_FILE_IMPORTS"
        );
    }
}

#[test]
fn file_imports_resolve_against_the_module_tree() {
    let module = |path: &str| module_path(Path::new(path));
    assert_eq!(module("cluster/index.rs"), ["cluster", "index"]);
    assert_eq!(module("cluster/mod.rs"), ["cluster"]);
    let here = module("cluster/index/changes.rs");
    let uses = module_uses(
        "use super::Caches;\nuse super::super::lease::{self, Ticks};\nlet x = crate::ipam::{held::State, request};\n",
        &here,
    );
    let joined: BTreeSet<String> = uses.iter().map(|p| p.join("::")).collect();
    for expected in [
        "cluster::index::Caches",
        "cluster::lease::Ticks",
        "ipam::held",
        "ipam::request",
    ] {
        assert!(joined.contains(expected), "{expected} in {joined:?}");
    }
}

/// A line's code for counting braces: string literals emptied, a char literal (`'{'`)
/// dropped, the comment cut off.
fn brace_code(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut at = 0;
    while at < chars.len() {
        match chars[at] {
            '"' => {
                at += 1;
                while at < chars.len() && chars[at] != '"' {
                    at += if chars[at] == '\\' { 2 } else { 1 };
                }
                out.push_str("\"\"");
                at += 1;
            }
            '\'' if chars.get(at + 2) == Some(&'\'') => at += 3,
            '\'' if chars.get(at + 1) == Some(&'\\') && chars.get(at + 3) == Some(&'\'') => at += 4,
            '/' if chars.get(at + 1) == Some(&'/') => break,
            c => {
                out.push(c);
                at += 1;
            }
        }
    }
    out
}

/// The name of the function a line starts (`pub(crate) async fn name(`), if it does.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = match after.strip_prefix('(') {
            Some(scoped) => &scoped[scoped.find(')')? + 1..],
            None => after,
        };
        if !rest.starts_with(char::is_whitespace) {
            return None;
        }
        rest = rest.trim_start();
    }
    for qualifier in ["async ", "const "] {
        if let Some(after) = rest.strip_prefix(qualifier) {
            rest = after.trim_start();
        }
    }
    let rest = rest.strip_prefix("fn ")?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// Each function of `code` (a file before its unit tests) with a body, as (name, lines from
/// its `fn` line to its closing brace). A function inside another counts in its lines only.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    let mut at = 0;
    while at < lines.len() {
        let Some(name) = fn_name(lines[at]) else {
            at += 1;
            continue;
        };
        let (mut depth, mut started, mut end) = (0i64, false, at);
        while end < lines.len() {
            let line = brace_code(lines[end]);
            let opens = line.matches('{').count() as i64;
            if !started && opens == 0 && line.contains(';') {
                break; // a declaration without a body
            }
            depth += opens - line.matches('}').count() as i64;
            started |= opens > 0;
            if started && depth <= 0 {
                break;
            }
            end += 1;
        }
        if started {
            found.push((name.to_string(), end - at + 1));
            at = end + 1;
        } else {
            at += 1;
        }
    }
    found
}

#[test]
fn no_function_runs_over_the_limit_before_the_unit_tests() {
    let mut over = Vec::new();
    let mut allowed_over = Vec::new();
    let mut counted = 0;
    for (_, path, text) in src_files() {
        for (name, lines) in function_lengths(&before_unit_tests(&text)) {
            counted += 1;
            let file = path.to_string_lossy();
            if lines <= MAX_FN_LINES {
                continue;
            }
            if ALLOWED_LONG_FNS.contains(&(file.as_ref(), name.as_str())) {
                allowed_over.push((file.to_string(), name));
            } else {
                over.push(format!("src/{}: {name} runs {lines} lines", path.display()));
            }
        }
    }
    assert!(counted > 500, "only {counted} functions found in src/");
    assert!(
        over.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them by what each part decides): {over:#?}"
    );
    for (file, name) in ALLOWED_LONG_FNS {
        assert!(
            allowed_over.iter().any(|(f, n)| f == file && n == name),
            "src/{file}: {name} is no longer over {MAX_FN_LINES} lines: remove it from ALLOWED_LONG_FNS"
        );
    }
}

#[test]
fn function_lengths_count_from_the_fn_line_to_its_closing_brace() {
    let code = "pub(crate) async fn outer(x: u8) -> u8 {\n    let s = \"}}\"; // }\n    let c = '{';\n    fn inner() {}\n    x\n}\nfn declared();\npub const fn one()\n-> u8\n{\n    1\n}\n";
    assert_eq!(
        function_lengths(code),
        [("outer".to_string(), 6), ("one".to_string(), 5)]
    );
    assert_eq!(fn_name("    pub fn fine() {"), Some("fine"));
    assert_eq!(fn_name("let fnord = 1;"), None);
    assert_eq!(fn_name("publish fn x"), None);
}
