#!/usr/bin/env bash
# //deploy:k8s_manifests_test: renders deploy/k8s (the base) and
# deploy/k8s/overlays/gpu with `kubectl kustomize`, validates every object
# (and the CLI pod, and the token Secret made as deploy/k8s/README.md says)
# against the Kubernetes API schema with tools/k8s_validate, checks the
# properties the deployment depends on (deploy/k8s/test/pods.py check), that
# the kustomizations use only fields kubectl 1.20's kustomize (v2.0.3) knows,
# and that the validator does fail on a typo'd field, a wrong type, an
# unknown kind. Skips only without kubectl or node.
# Usage: manifests_test.sh VALIDATE_JS
set -euo pipefail
VALIDATE="$PWD/$1"
KUBECTL="${KUBECTL:-kubectl}"
PY=/usr/bin/python3
T="${TEST_TMPDIR:-$(mktemp -d)}/k8s_manifests"
rm -rf "$T" && mkdir -p "$T"

log() { echo "[k8s_manifests $(date +%H:%M:%S)] $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

if ! command -v "$KUBECTL" >/dev/null; then
  echo "SKIP: no kubectl (tools/setup.sh installs Debian's kubernetes-client)"; exit 0
fi
if ! command -v node >/dev/null; then
  echo "SKIP: no node (tools/setup.sh installs Debian's nodejs)"; exit 0
fi
# Bazel runs the runfiles' symlink; node resolves modules from the real file,
# next to which tools/setup.sh ran `npm ci`.
real=$(readlink -f "$VALIDATE")
[ -d "$(dirname "$real")/node_modules/kubernetes-models" ] ||
  fail "$(dirname "$real")/node_modules is missing: run tools/setup.sh (npm ci in tools/k8s_validate)"
# kustomize does not take a symlinked kustomization.yaml (Bazel's runfiles):
# render a copy.
K8S="$T/k8s"
cp -rL deploy/k8s "$K8S"
"$PY" -c 'import yaml' 2>/dev/null || fail "$PY has no yaml module: run tools/setup.sh (python3-yaml)"
log "kubectl: $("$KUBECTL" version --client 2>/dev/null | head -n 1)"

validate() {  # validate NAME FILE: every object in FILE is valid
  node "$VALIDATE" <"$2" >"$T/$1.validate" 2>&1 || { cat "$T/$1.validate" >&2; fail "$1: invalid objects"; }
  log "$1: $(tail -n 1 "$T/$1.validate")"
}

# The kustomizations: only fields kustomize v2.0.3 (kubectl 1.20) reads; it
# refuses any other ("json: unknown field") and takes directories only
# under bases:.
for k in "$K8S/kustomization.yaml" "$K8S"/*/kustomization.yaml "$K8S"/overlays/*/kustomization.yaml; do
  [ -f "$k" ] || continue
  "$PY" - "$k" <<'PY' || fail "$k uses fields kustomize v2.0.3 does not know"
import os, sys, yaml
known = {"apiVersion", "kind", "namePrefix", "nameSuffix", "namespace", "commonLabels",
         "commonAnnotations", "resources", "bases", "patchesStrategicMerge", "patchesJson6902",
         "configMapGenerator", "secretGenerator", "generatorOptions", "images", "imageTags",
         "vars", "crds", "configurations"}
path = sys.argv[1]
k = yaml.safe_load(open(path))
extra = set(k) - known
if extra:
    sys.exit(f"{path}: {sorted(extra)}")
for r in k.get("resources", []):
    if os.path.isdir(os.path.join(os.path.dirname(path), r)):
        sys.exit(f"{path}: resources: {r} is a directory (v2.0.3 wants it under bases:)")
PY
done

"$KUBECTL" kustomize "$K8S" >"$T/base.yaml" 2>"$T/base.err" || { cat "$T/base.err" >&2; fail "kubectl kustomize $K8S"; }
"$KUBECTL" kustomize "$K8S/overlays/gpu" >"$T/gpu.yaml" 2>"$T/gpu.err" ||
  { cat "$T/gpu.err" >&2; fail "kubectl kustomize $K8S/overlays/gpu"; }
validate base "$T/base.yaml"
validate gpu "$T/gpu.yaml"
validate cli-pod "$K8S/cli-pod.yaml"
# The token Secret, made the way deploy/k8s/README.md says.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/token"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/agent-token"
"$KUBECTL" -n lockstep create secret generic lockstep-token --from-file=token="$T/token" \
  --from-file=agent-token="$T/agent-token" \
  --dry-run=client -o yaml >"$T/secret.yaml" || fail "kubectl create secret --dry-run=client"
validate secret "$T/secret.yaml"
"$PY" - "$T/secret.yaml" "$T/token" "$T/agent-token" <<'PY' || fail "the README's Secret does not hold the tokens under keys token and agent-token"
import base64, sys, yaml
s = yaml.safe_load(open(sys.argv[1]))
assert s["metadata"]["name"] == "lockstep-token" and s["metadata"]["namespace"] == "lockstep"
assert base64.b64decode(s["data"]["token"]).decode() == open(sys.argv[2]).read()
assert base64.b64decode(s["data"]["agent-token"]).decode() == open(sys.argv[3]).read()
PY

"$PY" deploy/k8s/test/pods.py check "$T/base.yaml" || fail "the base"
"$PY" deploy/k8s/test/pods.py check "$T/gpu.yaml" --gpu || fail "the GPU overlay"
# The overlay changes the agent only.
"$PY" - "$T/base.yaml" "$T/gpu.yaml" <<'PY' || fail "the GPU overlay changes more than the agent"
import sys, yaml
base = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(open(sys.argv[1])) if o}
gpu = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(open(sys.argv[2])) if o}
assert base.keys() == gpu.keys()
changed = [k for k in base if base[k] != gpu[k]]
assert changed == [("DaemonSet", "lockstep-agent")], changed
PY

# The validator fails on what it should: each broken copy of the base must
# be refused, naming the object and the field.
broken() {  # broken NAME PYTHON-EXPR-ON-objs EXPECTED-OUTPUT
  "$PY" - "$T/base.yaml" "$2" >"$T/broken-$1.yaml" <<'PY'
import sys, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
by = {o["kind"]: o for o in objs}
exec(sys.argv[2])
yaml.safe_dump_all(objs, sys.stdout)
PY
  if node "$VALIDATE" <"$T/broken-$1.yaml" >"$T/broken-$1.out" 2>&1; then
    fail "the validator accepted $1"
  fi
  grep -qF "$3" "$T/broken-$1.out" || { cat "$T/broken-$1.out" >&2; fail "$1: expected '$3'"; }
  log "refused $1: $(grep -F "$3" "$T/broken-$1.out" | head -n 1)"
}
agent='by["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]'
broken typo "$agent['comand'] = $agent.pop('command')" \
  "error DaemonSet/lockstep-agent: spec.template.spec.containers[0].comand: unknown field"
broken nested-typo "$agent['securityContext']['readOnlyRootFileSystem'] = True" \
  "containers[0].securityContext.readOnlyRootFileSystem: unknown field"
broken wrong-type 'by["StatefulSet"]["spec"]["replicas"] = "one"' \
  "error StatefulSet/lockstep-coordinator: schema: data/spec/replicas must be integer"
broken probe-type "$agent['livenessProbe']['grpc']['port'] = 'grpc'" \
  "error DaemonSet/lockstep-agent: schema: data/spec/template/spec/containers/0/livenessProbe/grpc/port must be integer"
broken unknown-kind 'by["Service"]["kind"] = "Servce"' "error Servce/lockstep-coordinator: unknown kind Servce in v1"
broken missing-required 'del by["StatefulSet"]["spec"]["selector"]' \
  "error StatefulSet/lockstep-coordinator: schema: data/spec must have required property selector"
# And the property checks fail on what they should.
unchecked() {  # unchecked NAME PYTHON-EXPR-ON-objs EXPECTED-MESSAGE
  "$PY" - "$T/base.yaml" "$2" >"$T/unchecked-$1.yaml" <<'PY'
import sys, yaml
objs = [o for o in yaml.safe_load_all(open(sys.argv[1])) if o]
by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
exec(sys.argv[2])
yaml.safe_dump_all(objs, sys.stdout)
PY
  if "$PY" deploy/k8s/test/pods.py check "$T/unchecked-$1.yaml" >"$T/unchecked-$1.out" 2>&1; then
    fail "pods.py check accepted $1"
  fi
  grep -qF "$3" "$T/unchecked-$1.out" || { cat "$T/unchecked-$1.out" >&2; fail "$1: expected '$3'"; }
  log "check refused $1: $(tail -n 1 "$T/unchecked-$1.out")"
}
ds='by[("DaemonSet", "lockstep-agent")]["spec"]["template"]["spec"]'
sts='by[("StatefulSet", "lockstep-coordinator")]["spec"]["template"]["spec"]'
unchecked probe-port "$ds['containers'][0]['livenessProbe']['grpc']['port'] = 7070" "livenessProbe checks"
unchecked http-probe "$sts['containers'][0]['readinessProbe'] = {'httpGet': {'port': 7070}}" "readinessProbe is not a gRPC probe"
unchecked token-flag "$ds['containers'][0]['args'] = [a for a in $ds['containers'][0]['args'] if not a.startswith('--token-file')]" \
  "is not a file of a mounted volume"
unchecked secret-mode "$ds['volumes'][0]['secret']['defaultMode'] = 0o440" "must be defaultMode 0400"
unchecked cap "$ds['containers'][0]['securityContext']['capabilities']['add'].append('SYS_ADMIN')" "outside the baseline profile"
unchecked root-coordinator "$sts['securityContext']['runAsUser'] = 0; $sts['securityContext']['runAsNonRoot'] = False" \
  "must run as a non-root uid"
unchecked policy "by[('NetworkPolicy', 'lockstep-coordinator')]['spec']['podSelector']['matchLabels']['app.kubernetes.io/component'] = 'agent'" \
  "does not select the coordinator alone"
unchecked gpu-in-base "$ds['containers'][0]['resources']['limits']['nvidia.com/gpu'] = 1" "nvidia.com/gpu limit present"
unchecked no-scrape "del by[('DaemonSet', 'lockstep-agent')]['spec']['template']['metadata']['annotations']['prometheus.io/scrape']" \
  "agent: pod annotations"
unchecked metrics-port "by[('StatefulSet', 'lockstep-coordinator')]['spec']['template']['metadata']['annotations']['prometheus.io/port'] = '9090'" \
  "coordinator: pod annotations"
unchecked metrics-policy "by[('NetworkPolicy', 'lockstep-agent')]['spec']['ingress'].pop()" \
  "does not admit the metrics port"
unchecked no-token-sync "$sts['containers'].pop()" "no container keeps the token copies in step"
unchecked token-sync-ro "$sts['containers'][1]['volumeMounts'][1]['readOnly'] = True" \
  "no container keeps the token copies in step"
log "PASS"
