"""Strict schema check of the custom resources a chart renders (kinds kubernetes-validate has
no schema for), against pydantic models generated from the upstream CRDs (cloudcoil).

Usage: validate_crs.py FILE...   (multi-document YAML; other kinds are reported as SKIP)
Prints one line per document: PASS/FAIL/SKIP FILE kind/name [reason]; exits 1 on any FAIL.
Strict: a field the model does not know is a failure (pydantic itself would drop it)."""

import sys

import yaml
from cloudcoil.models.cert_manager import v1 as cert_manager_v1
from cloudcoil.models.prometheus_operator import v1 as prometheus_v1

MODELS = {
    ("cert-manager.io/v1", "Certificate"): cert_manager_v1.Certificate,
    ("cert-manager.io/v1", "Issuer"): cert_manager_v1.Issuer,
    ("cert-manager.io/v1", "ClusterIssuer"): cert_manager_v1.ClusterIssuer,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): prometheus_v1.ServiceMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): prometheus_v1.PrometheusRule,
}


def unknown_fields(given, known, path=""):
    """Paths present in `given` but dropped from `known` (the model's dump)."""
    missing = []
    if isinstance(given, dict):
        for key, value in given.items():
            here = f"{path}.{key}" if path else key
            if not isinstance(known, dict) or key not in known:
                missing.append(here)
            else:
                missing += unknown_fields(value, known[key], here)
    elif isinstance(given, list) and isinstance(known, list):
        for index, (a, b) in enumerate(zip(given, known)):
            missing += unknown_fields(a, b, f"{path}[{index}]")
    return missing


def check_file(path):
    failed = False
    with open(path) as f:
        documents = [d for d in yaml.safe_load_all(f) if d]
    for doc in documents:
        name = f"{path} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        model = MODELS.get((doc.get("apiVersion"), doc.get("kind")))
        if model is None:
            print(f"SKIP {name}")
            continue
        try:
            parsed = model.model_validate(doc)
        except Exception as error:  # pydantic.ValidationError, with every failing field
            print(f"FAIL {name} {' '.join(str(error).split())}")
            failed = True
            continue
        dumped = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
        unknown = unknown_fields(doc, dumped)
        if unknown:
            print(f"FAIL {name} unknown fields: {', '.join(unknown)}")
            failed = True
        else:
            print(f"PASS {name}")
    return failed


if __name__ == "__main__":
    results = [check_file(path) for path in sys.argv[1:]]
    sys.exit(1 if any(results) else 0)
