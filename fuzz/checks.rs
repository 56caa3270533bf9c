//! The properties each fuzz target checks. Shared, via `#[path]`, by the cargo-fuzz targets in
//! `fuzz/fuzz_targets/` and by `tests/fuzz_corpus.rs`, which replays the committed corpus in CI.
//! Every function panics when a property fails; returning means the input was handled.
// each fuzz target uses one of these
#![allow(dead_code)]

use std::net::IpAddr;

use ip_webhook_admission::annotations::{Cni, parse_calico_ip_addrs, parse_ovn_ip_address};
use ip_webhook_admission::patch::MetadataPatch;
use ip_webhook_admission::{self as admission, MetaOnly};
use ip_webhook_ipam::ipset::{Family, parse_ip_spec};

/// The AdmissionReview decoder: never panics; an accepted review has a uid, its object (if
/// metadata decodes) is readable, and the response it yields is JSON echoing uid and version.
pub fn check_decode(data: &[u8]) {
    let Ok(incoming) = admission::decode(data) else {
        return;
    };
    assert!(!incoming.uid().is_empty(), "decode accepted an empty uid");
    let _ = incoming.object::<MetaOnly>(false);
    let _ = incoming.object::<MetaOnly>(true);
    let response = incoming.respond().deny("fuzz").to_json();
    let value: serde_json::Value =
        serde_json::from_slice(&response).expect("a response is always JSON");
    assert_eq!(value["apiVersion"], incoming.api_version);
    assert_eq!(value["response"]["uid"], incoming.uid());
    assert_eq!(value["response"]["allowed"], false);
}

/// The IP-spec parser: never panics; an accepted spec is non-empty, and its canonical text
/// parses back to the same set.
pub fn check_ip_spec(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(set) = parse_ip_spec(text) else {
        return;
    };
    assert!(!set.is_empty(), "accepted {text:?} as an empty set");
    let canonical = set.to_string();
    let again = parse_ip_spec(&canonical)
        .unwrap_or_else(|e| panic!("canonical form {canonical:?} of {text:?} fails: {e}"));
    assert_eq!(again.ranges(), set.ranges(), "{text:?} -> {canonical:?}");
    for family in set.families() {
        let first = set.nth(family, 0).expect("a present family has a first IP");
        assert!(set.contains(&first));
    }
}

/// The CNI annotation parsers: never panic; accepted values hold one IP per family at most and
/// survive a format/parse round trip through the CNI's own writer.
pub fn check_annotations(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for (cni, parsed) in [
        (Cni::Calico, parse_calico_ip_addrs(text)),
        (Cni::KubeOvn, parse_ovn_ip_address(text)),
    ] {
        let Ok(ips) = parsed else { continue };
        assert!(!ips.is_empty() && ips.len() <= 2, "{text:?} -> {ips:?}");
        let families: Vec<Family> = ips.iter().map(Family::of).collect();
        assert!(
            families.len() < 2 || families[0] != families[1],
            "{text:?} gave two IPs of one family"
        );
        let written = cni.format(&ips);
        let back: Vec<IpAddr> = match cni {
            Cni::Calico => parse_calico_ip_addrs(&written),
            Cni::KubeOvn => parse_ovn_ip_address(&written),
        }
        .unwrap_or_else(|e| panic!("{cni:?} wrote {written:?} that it cannot read: {e}"));
        assert_eq!(back, ips);
    }
}

/// The patch builder: for any keys and values (split from the input), the patch is JSON, and
/// applying it with an independent RFC 6902 implementation sets exactly those entries.
pub fn check_patch(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\u{0}');
    let flags = parts.next().unwrap_or("").bytes().next().unwrap_or(0);
    let labels_present = flags & 1 == 1;
    let annotations_present = flags & 2 == 2;
    let mut object = serde_json::json!({"metadata": {}});
    if labels_present {
        object["metadata"]["labels"] = serde_json::json!({});
    }
    if annotations_present {
        object["metadata"]["annotations"] = serde_json::json!({});
    }
    let mut patch = MetadataPatch::default();
    let mut expected = serde_json::json!({"labels": {}, "annotations": {}});
    let mut any = false;
    while let (Some(key), Some(value)) = (parts.next(), parts.next()) {
        if key.is_empty() {
            continue;
        }
        let (map, present) = if key.len() % 2 == 0 {
            ("labels", labels_present)
        } else {
            ("annotations", annotations_present)
        };
        patch.add(map, present, key, value);
        expected[map][key] = serde_json::Value::String(value.to_string());
        any = true;
    }
    assert_eq!(patch.is_empty(), !any);
    let bytes = patch.to_json();
    let ops: json_patch::Patch = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "patch is not RFC 6902 JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    json_patch::patch(&mut object, &ops).unwrap_or_else(|e| {
        panic!(
            "patch does not apply ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    for map in ["labels", "annotations"] {
        let want = expected[map].as_object().unwrap();
        if want.is_empty() {
            continue;
        }
        assert_eq!(
            &object["metadata"][map], &expected[map],
            "{map} after the patch"
        );
    }
}
