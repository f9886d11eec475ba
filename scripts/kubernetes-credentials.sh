#!/usr/bin/env bash
# The Secrets that deploy/kubernetes expects, made on the operator's machine:
#   tls     Secret trainyard-tls (tls.crt, tls.key, ca.crt): a CA and the coordinator's
#           certificate for trainyard-coordinator[.NAMESPACE[.svc[.cluster.local]]], made with
#           openssl in DIR (keep ca.key safe; it signs whatever you give it).
#   agents  Secret trainyard-agent-tokens: one agent token per GPU node (key = node name), made
#           by the running coordinator with its admin token. Run it again when nodes join.
#   admin   prints the admin token the coordinator made at its first start.
# Usage: scripts/kubernetes-credentials.sh tls DIR | agents | admin   (NAMESPACE=trainyard)
set -euo pipefail
ns=${NAMESPACE:-trainyard}
pod=trainyard-coordinator-0
kube() { kubectl -n "$ns" "$@"; }
# Runs the CLI inside the coordinator's pod as an admin (its token is in the state folder), over
# TLS to 127.0.0.1 with the mounted CA.
cli() {
  kube exec "$pod" -- sh -c 'TRAINYARD_TOKEN_FILE=/var/lib/trainyard/admin.token \
    trainyard --coordinator=127.0.0.1:7070 --ca /etc/trainyard/tls/ca.crt "$@"' trainyard "$@"
}

case ${1:-} in
  tls)
    dir=${2:?usage: kubernetes-credentials.sh tls DIR}
    mkdir -p "$dir" && cd "$dir"
    [[ -s ca.key ]] || openssl req -x509 -newkey rsa:3072 -nodes -days 3650 \
      -subj "/CN=trainyard-ca" -keyout ca.key -out ca.crt
    openssl req -newkey rsa:3072 -nodes -subj "/CN=trainyard-coordinator" \
      -keyout tls.key -out tls.csr
    printf 'subjectAltName=DNS:trainyard-coordinator,DNS:trainyard-coordinator.%s,DNS:trainyard-coordinator.%s.svc,DNS:trainyard-coordinator.%s.svc.cluster.local,IP:127.0.0.1\n' \
      "$ns" "$ns" "$ns" >tls.ext
    openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
      -extfile tls.ext -out tls.crt
    kube create secret generic trainyard-tls --from-file=tls.crt --from-file=tls.key \
      --from-file=ca.crt --dry-run=client -o yaml | kubectl apply -f -
    echo "Secret trainyard-tls applied; clients verify with $dir/ca.crt (TRAINYARD_CA_FILE)"
    ;;
  agents)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    kube get secret trainyard-agent-tokens -o json 2>/dev/null \
      | python3 -c 'import base64, json, sys, os
for k, v in json.load(sys.stdin)["data"].items():
    open(os.path.join(sys.argv[1], k), "wb").write(base64.b64decode(v))' "$tmp" || true
    for node in $(kubectl get nodes -l nvidia.com/gpu.present=true -o name | cut -d/ -f2); do
      [[ -s $tmp/$node ]] && continue
      cli token create "$node" --role agent >"$tmp/$node"
      echo "agent token for $node"
    done
    kube create secret generic trainyard-agent-tokens --from-file="$tmp" \
      --dry-run=client -o yaml | kubectl apply -f -
    ;;
  admin)
    kube exec "$pod" -- cat /var/lib/trainyard/admin.token
    ;;
  *)
    sed -n '2,10p' "$0" >&2
    exit 2
    ;;
esac
