#!/usr/bin/env bash
# Fails when a binary is larger than its budget, saying by how much.
#   scripts/check-binary-size.sh BINARY BUDGET_MIB
# The release workflow runs it on the dist binary it ships (.github/workflows/release.yml);
# after `cargo build --release`, run it on target/release/ip-webhook with the README's figure.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BINARY BUDGET_MIB" >&2; exit 2; }
binary=$1 budget_mib=$2
size=$(wc -c <"$binary")
mib=$(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1048576 }')
if [ "$size" -gt $((budget_mib * 1048576)) ]; then
  echo "$binary is $mib MiB, over its budget of $budget_mib MiB: look for debug info the profile keeps ([profile.release] in Cargo.toml) or a new dependency" >&2
  exit 1
fi
echo "$binary is $mib MiB, within its budget of $budget_mib MiB"
