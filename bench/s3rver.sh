# Sourced by the benchmarks that need an S3 endpoint: start_s3rver WORK_DIR BUCKET starts s3rver
# (from scripts/install-deps.sh) on loopback with its data in WORK_DIR/data, waits until it
# listens, sets s3rver_pid and exports its endpoint and credentials (AWS_*). The caller's cleanup
# kills "$s3rver_pid".
start_s3rver() {
  local work=$1 bucket=$2
  local s3rver=${S3RVER:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.tools/node_modules/.bin/s3rver}
  mkdir -p "$work/data"
  # s3rver's list continuation tokens use DES, which Node's OpenSSL 3 keeps in the legacy provider.
  NODE_OPTIONS=--openssl-legacy-provider "$s3rver" -d "$work/data" -a 127.0.0.1 -p 0 -s \
    --configure-bucket "$bucket" >"$work/s3rver.log" 2>&1 &
  s3rver_pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$work/s3rver.log" 2>/dev/null && break; sleep 0.1; done
  local port
  port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/s3rver.log")
  [ -n "$port" ] || { echo "s3rver did not start" >&2; cat "$work/s3rver.log" >&2; return 1; }
  export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=S3RVER \
    AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1
}
