#!/usr/bin/env python3
"""Writes deploy/helm/ip-webhook/README.md from the chart's Chart.yaml and values.yaml.

Every key of values.yaml gets a row (leaves, free-form objects such as the probes shown whole,
and maps of settings that carry a description), with its default and the text of the `# -- ` comment above it (continued by the `#` lines that follow
it), as helm-docs reads them. tests/chart_values.rs fails when the README is stale.

Usage: scripts/chart-readme.py [OUTPUT]   (OUTPUT "-" prints to standard output)
Needs PyYAML: the venv of scripts/install-test-deps.sh has it (.tools/venv/bin/python).
"""

import json
import os
import re
import sys

try:
    import yaml
except ImportError:  # the system Python may lack PyYAML; the test venv has it
    venv = os.path.join(os.path.dirname(__file__), "..", ".tools", "venv", "bin", "python")
    if os.path.exists(venv) and os.path.realpath(sys.executable) != os.path.realpath(venv):
        os.execv(venv, [venv, *sys.argv])
    sys.exit("chart-readme.py needs PyYAML: run scripts/install-test-deps.sh")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CHART = os.path.join(ROOT, "deploy", "helm", "ip-webhook")
KEY = re.compile(r"^(\s*)([A-Za-z0-9_.-]+):(\s.*)?$")

HEADER = """# {name} Helm chart

{description}.

Generated from `values.yaml` by `scripts/chart-readme.py`: do not edit; change the comments
in `values.yaml` and run the script. The full install guide is
[docs/install.md](../../../docs/install.md).

Chart version `{version}`, app version `{appVersion}`, Kubernetes `{kubeVersion}`.

## Install

No release of ip-webhook has been published yet, so the default image does not exist yet
({image}). Build the image from the repository's `Dockerfile`, push it to a registry the
cluster pulls from, and point the chart at it:

```sh
docker build -t registry.example.com/ip-webhook:{appVersion} .
docker push registry.example.com/ip-webhook:{appVersion}
helm install ip-webhook deploy/helm/ip-webhook \\
  --namespace ip-webhook-system --create-namespace \\
  --set image.registry=registry.example.com --set image.repository=ip-webhook
kubectl -n ip-webhook-system rollout status deployment/ip-webhook
```

The default is where `.github/workflows/release.yml` publishes the image of a release tag
(linux/amd64 and linux/arm64). The chart needs cert-manager unless
`validatingWebhook.certificate.source` is `helm` or `existing`. After the install, the notes
Helm prints say how to check it with `kubectl ipw check`.

## Keys of other charts

Keys that other charts use for what this chart spells otherwise. The chart refuses each,
naming the key to use:

| other charts | for | this chart |
|---|---|---|
{spellings}
`values.schema.json` checks every key: a misspelt key or an out-of-range value fails
`helm install` with a message naming it. A key it does not know fails with `additional
properties 'KEY' not allowed`, at the path of the object it is in (`at ''` is the top level,
`at '/server'` is under `server`); find the key in the table below.

## Values

| Key | Default | Description |
|---|---|---|
"""


def described_keys(lines):
    """(path, description) for each key of values.yaml, in file order."""
    stack = []  # (indent, key)
    description = None
    for line in lines:
        stripped = line.strip()
        if not stripped:
            description = None
            continue
        if stripped.startswith("#"):
            text = stripped[1:].strip()
            if text.startswith("-- "):
                description = [text[3:]]
            elif text == "--":
                description = []
            elif description is not None:
                description.append(text)
            continue
        if stripped.startswith("- "):
            continue
        match = KEY.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        yield [k for _, k in stack], " ".join(description or [])
        description = None


def lookup(values, path):
    for key in path:
        values = values[key]
    return values


def schema_of(schema, path):
    """The schema node of path; None under a free-form object (one with no properties)."""
    for key in path:
        if schema is None or "properties" not in schema:
            return None
        schema = schema["properties"].get(key)
    return schema


def cell(text):
    return text.replace("|", "\\|")


def default(value):
    if value is None:
        return "`null`"
    if isinstance(value, str):
        return '`""`' if value == "" else f"`{value}`"
    return "`" + json.dumps(value, separators=(", ", ": ")) + "`"


def render():
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        chart = yaml.safe_load(f)
    with open(os.path.join(CHART, "values.yaml")) as f:
        text = f.read()
    values = yaml.safe_load(text)
    with open(os.path.join(CHART, "values.schema.json")) as f:
        schema = json.load(f)
    image = values["image"]
    name = f"{image['registry']}/{image['repository']}" if image["registry"] else image["repository"]
    with open(os.path.join(CHART, "files", "other-spellings.yaml")) as f:
        spellings = "".join(
            f"| `{key}` | {cell(entry['for'])} | {cell(entry['use'])} |\n"
            for key, entry in yaml.safe_load(f).items()
        )
    out = [HEADER.format(image=f"{name}:{chart['appVersion']}", spellings=spellings, **chart)]
    for path, description in described_keys(text.splitlines()):
        node = schema_of(schema, path)
        if node is None:
            continue  # inside a free-form object: shown whole in its parent's row
        value = lookup(values, path)
        has_children = isinstance(value, dict) and value and "properties" in node
        if has_children and not description:
            continue
        shown = "" if has_children else default(value)
        out.append(f"| `{'.'.join(path)}` | {cell(shown)} | {cell(description)} |\n")
    return "".join(out)


def main():
    target = sys.argv[1] if len(sys.argv) > 1 else os.path.join(CHART, "README.md")
    readme = render()
    if target == "-":
        sys.stdout.write(readme)
    else:
        with open(target, "w") as f:
            f.write(readme)
        print(f"wrote {os.path.relpath(target)}")


if __name__ == "__main__":
    main()
