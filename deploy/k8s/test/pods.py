#!/usr/bin/python3
"""Reads rendered manifests (kubectl kustomize output) for the k8s tests.

Subcommands (RENDERED is a multi-document YAML file):

  check RENDERED [--gpu]
      Asserts the properties the deployment depends on (see check()); exits 1
      naming the first that does not hold.
  volumes RENDERED WORKLOAD POD_DIR TOKEN
      Makes POD_DIR/vol/<volume> for each volume of the pod, as the kubelet
      would: a Secret's keys behind ..data symlinks with defaultMode (and,
      with fsGroup, group fsGroup and group read), an emptyDir 0777, a
      volumeClaimTemplate's volume root-owned (group fsGroup, 2775 with one).
      TOKEN is the file standing in for the Secret's data.
  update-secrets RENDERED WORKLOAD POD_DIR TOKEN
      The pod's Secret volumes after the Secret changed to TOKEN's files, as
      the kubelet updates them: a new timestamped directory, ..data swapped
      to it in one rename, the old one removed.
  run RENDERED WORKLOAD CONTAINER POD_DIR NETNS POD_IP NODE_NAME POD_NAME IMAGE_ROOT
      Prints, NUL-separated, the command line that runs the container as a
      container runtime would, in the pod's network namespace NETNS: a
      private mount and PID namespace (the container is PID 1), its volumes
      writable and the rest of / read-only with readOnlyRootFilesystem, a
      fresh /dev/shm (1777, 64 MiB, as containerd makes it), then the
      container's command and args ($(VAR) expanded from its env, downward
      API values from POD_IP/NODE_NAME/POD_NAME) with the environment a
      runtime gives (PATH, HOSTNAME, HOME, the manifest's env), as its user,
      groups (fsGroup added) and capabilities (setpriv: bounding set, no
      inheritable or ambient ones, no_new_privs without
      allowPrivilegeEscalation). Mount paths in arguments and env are mapped
      to POD_DIR/vol/<volume>; absolute programs to IMAGE_ROOT + path.
  exec RENDERED WORKLOAD CONTAINER POD_DIR POD_IP NODE_NAME POD_NAME IMAGE_ROOT PID -- ARGV...
      The same for `kubectl exec` into a running container whose PID 1 is
      PID: its namespaces (nsenter), environment, user and capabilities.
  probes RENDERED WORKLOAD CONTAINER
      Prints "KIND PORT SERVICE" for each of its gRPC probes.
  caps RENDERED WORKLOAD CONTAINER
      Prints the capability mask (as /proc/PID/status shows CapEff) its
      securityContext gives a root process.
  netpol RENDERED POD...
      Applies the NetworkPolicies as iptables rules inside each pod's
      network namespace; POD is NETNS,IP,NODE_IP,WORKLOAD (the workload's
      pod template labels). Supports what the manifests use: podSelector
      matchLabels in the policy's namespace, TCP ports; anything else is an
      error, not a silent allow.
  health ADDRESS [SERVICE]
      grpc.health.v1.Health/Check as the kubelet's gRPC probe makes it;
      prints SERVING, NOT_SERVING or the failure.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import yaml

LISTEN_PORT_FLAG = "--listen="
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The capabilities the baseline Pod Security Standard lets a container add.
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                 "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def die(msg):
    print(f"pods.py: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(objs, kind, name):
    for o in objs:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    die(f"no {kind}/{name} in the rendered manifests")


def workload(objs, spec):
    """WORKLOAD is Kind/name; returns (object, pod spec, pod labels)."""
    kind, name = spec.split("/", 1)
    o = find(objs, kind, name)
    if kind == "Pod":
        return o, o["spec"], o["metadata"].get("labels", {})
    tmpl = o["spec"]["template"]
    return o, tmpl["spec"], tmpl["metadata"].get("labels", {})


def container(pod, name):
    for c in pod.get("initContainers", []) + pod["containers"]:
        if c["name"] == name:
            return c
    die(f"no container {name}")


def volumes_of(obj, pod):
    """Volume name -> (type, source) for the pod's volumes and claim templates."""
    vols = {}
    for v in pod.get("volumes", []):
        kinds = [k for k in v if k != "name"]
        vols[v["name"]] = (kinds[0], v[kinds[0]])
    for t in obj["spec"].get("volumeClaimTemplates", []) if obj["kind"] == "StatefulSet" else []:
        vols[t["metadata"]["name"]] = ("persistentVolumeClaim", t["spec"])
    return vols


def security(pod, c):
    """The container's effective security settings (pod level, then its own)."""
    psc = pod.get("securityContext", {})
    csc = c.get("securityContext", {})
    merged = {k: psc[k] for k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")
              if k in psc}
    merged.update(csc)
    merged["fsGroup"] = psc.get("fsGroup")
    merged["supplementalGroups"] = psc.get("supplementalGroups", [])
    return merged


def flag(argv, name):
    """The value of --name=VALUE in argv (the manifests spell flags that way)."""
    vals = [a[len(name) + 1:] for a in argv if a.startswith(name + "=")]
    return vals[-1] if vals else None


def argv_of(c):
    return list(c.get("command", [])) + list(c.get("args", []))


def check(objs, gpu):
    """The properties the deployment depends on, beyond the schema."""
    kinds = sorted(f'{o["kind"]}/{o["metadata"]["name"]}' for o in objs)
    want = ["DaemonSet/lockstep-agent", "Namespace/lockstep", "NetworkPolicy/lockstep-agent",
            "NetworkPolicy/lockstep-coordinator", "Service/lockstep-coordinator",
            "StatefulSet/lockstep-coordinator"]
    if kinds != want:
        die(f"objects are {kinds}, want {want}")
    for o in objs:
        if o["kind"] != "Namespace" and o["metadata"].get("namespace") != "lockstep":
            die(f'{o["kind"]}/{o["metadata"]["name"]} is not in namespace lockstep')
    sts, spod, slabels = workload(objs, "StatefulSet/lockstep-coordinator")
    ds, apod, alabels = workload(objs, "DaemonSet/lockstep-agent")
    svc = find(objs, "Service", "lockstep-coordinator")
    if sts["spec"].get("replicas") != 1 or sts["spec"]["serviceName"] != "lockstep-coordinator":
        die("the coordinator StatefulSet must have 1 replica and serviceName lockstep-coordinator")
    if svc["spec"].get("clusterIP") != "None":
        die("the coordinator Service must be headless (clusterIP: None)")
    if any(slabels.get(k) != v for k, v in svc["spec"]["selector"].items()):
        die("the Service does not select the coordinator's pods")

    for name, obj, pod, role in (("coordinator", sts, spod, "coordinator"),
                                 ("agent", ds, apod, "agent")):
        c = container(pod, "lockstepd")
        argv = argv_of(c)
        if argv[0] != "/usr/bin/lockstepd":
            die(f"{name}: runs {argv[0]}, not /usr/bin/lockstepd")
        listen = flag(argv, "--listen")
        if not listen:
            die(f"{name}: no --listen=")
        port = int(listen.rsplit(":", 1)[1])
        if listen.rsplit(":", 1)[0] != "0.0.0.0":
            die(f"{name}: listens on {listen}: other pods and the kubelet could not reach it")
        # Prometheus: --metrics-listen on every address, its port a
        # containerPort and the pod's scrape annotations.
        metrics = flag(argv, "--metrics-listen")
        if not metrics or metrics.rsplit(":", 1)[0] != "0.0.0.0":
            die(f"{name}: --metrics-listen={metrics}: Prometheus could not reach it")
        mport = int(metrics.rsplit(":", 1)[1])
        ports = [p["containerPort"] for p in c.get("ports", [])]
        if ports != [port, mport]:
            die(f"{name}: containerPorts {ports} are not the listen and metrics ports {[port, mport]}")
        ann = obj["spec"]["template"].get("metadata", {}).get("annotations", {})
        want_ann = {"prometheus.io/scrape": "true", "prometheus.io/port": str(mport),
                    "prometheus.io/path": "/metrics"}
        if any(ann.get(k) != v for k, v in want_ann.items()):
            die(f"{name}: pod annotations {ann} lack {want_ann}")
        # Native gRPC probes on the listen port, default ("") service: the
        # one lockstepd's SetServingStatus(bool) sets.
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if not p or set(p) & {"httpGet", "tcpSocket", "exec"} or "grpc" not in p:
                die(f"{name}: {probe} is not a gRPC probe: {p}")
            if p["grpc"].get("port") != port or p["grpc"].get("service", "") != "":
                die(f"{name}: {probe} checks {p['grpc']}, not the listen port {port}")
        # The token: a Secret volume, mounted, named by --token-file (the
        # coordinator through its init container's 0600 copy).
        vols = volumes_of(obj, pod)
        secret_vols = [n for n, (t, s) in vols.items()
                       if t == "secret" and s.get("secretName") == "lockstep-token"]
        if len(secret_vols) != 1:
            die(f"{name}: want one volume of Secret lockstep-token, got {secret_vols}")
        sv = vols[secret_vols[0]][1]
        # Separate credentials (daemon/README.md, Roles): the coordinator
        # holds the admin token and the agent token it checks agents
        # against; an agent holds the agent token alone, as its "token".
        want_items = ([{"key": "token", "path": "token"}, {"key": "agent-token", "path": "agent-token"}]
                      if role == "coordinator" else [{"key": "agent-token", "path": "token"}])
        if sv.get("defaultMode") != 0o400 or sv.get("items") != want_items:
            die(f"{name}: the token Secret volume must be defaultMode 0400 with items {want_items}")
        token_file = flag(argv, "--token-file")
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        mount_dir, file = os.path.split(token_file or "")
        if mount_dir not in mounts or file != "token":
            die(f"{name}: --token-file={token_file} is not a file of a mounted volume")
        m = mounts[mount_dir]
        if not m.get("readOnly"):
            die(f"{name}: the token's volume is mounted writable")
        if m["name"] != secret_vols[0]:
            # A copy: an init container must install it 0600 from the Secret.
            inits = [i for i in pod.get("initContainers", [])
                     if any(im["name"] == m["name"] for im in i.get("volumeMounts", []))]
            copiers = [i for i in inits if argv_of(i)[:3] == ["/usr/bin/install", "-m", "0600"]
                       and argv_of(i)[-1] == token_file]
            if not copiers or not any(im["name"] == secret_vols[0]
                                      for im in copiers[0]["volumeMounts"]):
                die(f"{name}: {token_file} is neither the Secret nor its 0600 copy")
        # Resources.
        res = c.get("resources", {})
        for k in ("cpu", "memory"):
            if k not in res.get("requests", {}):
                die(f"{name}: no {k} request")
        if "memory" not in res.get("limits", {}):
            die(f"{name}: no memory limit")
        # Security.
        sec = security(pod, c)
        if sec.get("allowPrivilegeEscalation") is not False or not sec.get("readOnlyRootFilesystem"):
            die(f"{name}: needs allowPrivilegeEscalation: false and readOnlyRootFilesystem")
        if pod.get("securityContext", {}).get("seccompProfile", {}).get("type") != "RuntimeDefault":
            die(f"{name}: the pod's seccompProfile is not RuntimeDefault")
        if sec.get("capabilities", {}).get("drop") != ["ALL"]:
            die(f"{name}: does not drop ALL capabilities")
        for k in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(k):
                die(f"{name}: {k}")
        if pod.get("automountServiceAccountToken") is not False:
            die(f"{name}: mounts a service account token it never uses")

    # Coordinator: no agent, non-root, no capability, state on a claim.
    c = container(spod, "lockstepd")
    argv = argv_of(c)
    if "--coordinator" not in argv or "--no-agent" not in argv:
        die("coordinator: wants --coordinator --no-agent")
    sec = security(spod, c)
    if not sec.get("runAsNonRoot") or not sec.get("runAsUser") or not sec.get("fsGroup"):
        die("coordinator: must run as a non-root uid with an fsGroup")
    if sec.get("capabilities", {}).get("add"):
        die("coordinator: adds capabilities")
    state = flag(argv, "--state-dir")
    claim = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}.get(state)
    if claim not in [t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates", [])]:
        die(f"coordinator: --state-dir={state} is not on a volumeClaimTemplate")
    if flag(argv, "--advertise-address") != "lockstep-coordinator:7070":
        die("coordinator: must advertise the Service's name")
    # The agent token: the Secret's, as a 0600 copy the coordinator owns.
    agent_token = flag(argv, "--agent-token-file")
    copiers = [i for i in spod.get("initContainers", [])
               if argv_of(i) == ["/usr/bin/install", "-m", "0600", "/etc/lockstep/secret/agent-token", agent_token]]
    if not agent_token or not copiers:
        die(f"coordinator: --agent-token-file={agent_token} is not a 0600 copy of the Secret's agent-token")

    # The copies follow the Secret: a container of the pod copies each key
    # the init containers copied, from the Secret to the file lockstepd
    # reads (so a rotated token needs no pod restart).
    syncers = [x for x in spod["containers"] if x is not c]
    mounts_of = lambda x: {m["name"]: m for m in x.get("volumeMounts", [])}
    token_vol = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}[os.path.dirname(flag(argv, "--token-file"))]
    ok = [x for x in syncers
          if secret_vol_name(sts, spod) in mounts_of(x) and token_vol in mounts_of(x)
          and not mounts_of(x)[token_vol].get("readOnly")
          and "/etc/lockstep/secret/" in " ".join(argv_of(x))
          and all(k in " ".join(argv_of(x)) for k in ("token", "agent-token"))]
    if len(ok) != 1:
        die("coordinator: no container keeps the token copies in step with the Secret")
    sec = security(spod, ok[0])
    if (sec.get("allowPrivilegeEscalation") is not False or not sec.get("readOnlyRootFilesystem")
            or sec.get("capabilities", {}).get("drop") != ["ALL"]
            or "memory" not in ok[0].get("resources", {}).get("limits", {})):
        die(f"coordinator: container {ok[0]['name']} lacks the lockstepd container's restrictions")

    # Agent: root, capabilities within the baseline profile, the pod's
    # address advertised (the workers' data plane), --job-uids, node id.
    c = container(apod, "lockstepd")
    argv = argv_of(c)
    if "--coordinator" in argv or "--no-agent" in argv:
        die("agent: must be an agent only")
    if flag(argv, "--coordinator-address") != "lockstep-coordinator:7070":
        die("agent: --coordinator-address must be the Service's name and port")
    env = {e["name"]: e for e in c.get("env", [])}
    def field_env(var, path):
        return env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == path
    if flag(argv, "--advertise-address") != "$(POD_IP):7071" or not field_env("POD_IP", "status.podIP"):
        die("agent: must advertise $(POD_IP):7071 with POD_IP from status.podIP")
    if flag(argv, "--node-id") != "$(NODE_NAME)" or not field_env("NODE_NAME", "spec.nodeName"):
        die("agent: --node-id must be $(NODE_NAME) from spec.nodeName")
    if not re.fullmatch(r"[1-9][0-9]*-[1-9][0-9]*", flag(argv, "--job-uids") or ""):
        die("agent: wants --job-uids=FIRST-LAST")
    # The state emptyDir past its sizeLimit gets the pod evicted: each rank's
    # two logs, with one rotated copy each, must leave room for 32 ranks.
    state_vol = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}.get(flag(argv, "--state-dir"))
    kind, src = volumes_of(ds, apod).get(state_vol, (None, {}))
    limit = str(src.get("sizeLimit", "")) if kind == "emptyDir" else ""
    units = {"Gi": 1 << 30, "Mi": 1 << 20}
    m = re.fullmatch(r"([0-9]+)(Gi|Mi)", limit)
    log_mb = flag(argv, "--max-log-mb")
    if not m or not log_mb:
        die(f"agent: the state emptyDir needs a sizeLimit ({limit!r}) and --max-log-mb a cap ({log_mb!r})")
    if 32 * 4 * float(log_mb) * (1 << 20) > int(m.group(1)) * units[m.group(2)]:
        die(f"agent: --max-log-mb={log_mb} lets 32 ranks' logs (4 x the cap each) outgrow the "
            f"state volume's sizeLimit {limit}: the kubelet would evict the pod")
    added = set(security(apod, c).get("capabilities", {}).get("add", []))
    if not added <= BASELINE_CAPS:
        die(f"agent: adds {sorted(added - BASELINE_CAPS)}, outside the baseline profile")
    if not {"SETUID", "SETGID", "KILL"} <= added:
        die("agent: cannot start or stop workers as other uids without SETUID SETGID KILL")
    limits = c.get("resources", {}).get("limits", {})
    if gpu != ("nvidia.com/gpu" in limits):
        die(f"agent: nvidia.com/gpu limit {'missing' if gpu else 'present'}: {limits}")
    if gpu and not (isinstance(limits["nvidia.com/gpu"], int) and limits["nvidia.com/gpu"] >= 1):
        die(f"agent: nvidia.com/gpu limit {limits['nvidia.com/gpu']!r} is not a positive count")

    # NetworkPolicies: the coordinator's port only from agents and CLI pods;
    # agents from each other on every port.
    pc = find(objs, "NetworkPolicy", "lockstep-coordinator")["spec"]
    if not matches(pc["podSelector"], slabels) or matches(pc["podSelector"], alabels):
        die("NetworkPolicy lockstep-coordinator does not select the coordinator alone")
    metrics_rule = {"ports": [{"protocol": "TCP", "port": 9470}]}
    if pc.get("policyTypes") != ["Ingress"] or len(pc["ingress"]) != 2 or pc["ingress"][1] != metrics_rule:
        die("NetworkPolicy lockstep-coordinator: want the gRPC rule and the metrics port from anywhere")
    rule = pc["ingress"][0]
    if rule.get("ports") != [{"protocol": "TCP", "port": 7070}]:
        die(f"NetworkPolicy lockstep-coordinator admits ports {rule.get('ports')}")
    peers = [p["podSelector"]["matchLabels"] for p in rule["from"]]
    if peers != [alabels, {"lockstep.dev/cli": "true"}]:
        die(f"NetworkPolicy lockstep-coordinator admits {peers}")
    pa = find(objs, "NetworkPolicy", "lockstep-agent")["spec"]
    if not matches(pa["podSelector"], alabels) or matches(pa["podSelector"], slabels):
        die("NetworkPolicy lockstep-agent does not select the agents alone")
    if not any("ports" not in r and [p["podSelector"]["matchLabels"] for p in r["from"]] == [alabels]
               for r in pa["ingress"]):
        die("NetworkPolicy lockstep-agent does not admit agents on every port")
    if metrics_rule not in pa["ingress"]:
        die("NetworkPolicy lockstep-agent does not admit the metrics port from anywhere")
    print(f"checked {len(objs)} objects{' (GPU overlay)' if gpu else ''}")


def matches(selector, labels):
    if set(selector) != {"matchLabels"}:
        die(f"selector {selector}: only matchLabels is supported here")
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def write_secret(d, src, fs_group, token, stamp):
    """The Secret's files in D/STAMP, as the kubelet writes them: the file
    TOKEN holds key "token", TOKEN.KEY any other key."""
    stamp = os.path.join(d, stamp)
    os.mkdir(stamp)
    mode = src.get("defaultMode", 0o644)
    group = 0
    if fs_group is not None:
        mode |= 0o440  # read-only volumes get group read with fsGroup
        group = fs_group
    for item in src["items"]:
        with open(token if item["key"] == "token" else f"{token}.{item['key']}") as f:
            data = f.read()
        p = os.path.join(stamp, item["path"])
        with open(p, "w") as f:
            f.write(data)
        os.chown(p, 0, group)
        os.chmod(p, item.get("mode", mode))
    os.chmod(stamp, 0o755)


def update_secrets(objs, spec, pod_dir, token):
    """A changed Secret, as the kubelet updates a mounted one: the new files
    in a new timestamped directory, then ..data swapped to it in one rename
    (the item links point through ..data), the old directory removed."""
    obj, pod, _ = workload(objs, spec)
    fs_group = pod.get("securityContext", {}).get("fsGroup")
    for name, (kind, src) in volumes_of(obj, pod).items():
        if kind != "secret":
            continue
        d = os.path.join(pod_dir, "vol", name)
        old = os.readlink(os.path.join(d, "..data"))
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()) + "%09d" % time.time_ns()
        write_secret(d, src, fs_group, token, stamp)
        os.symlink(stamp, os.path.join(d, "..data_tmp"))
        os.replace(os.path.join(d, "..data_tmp"), os.path.join(d, "..data"))
        shutil.rmtree(os.path.join(d, old))


def secret_vol_name(obj, pod):
    return [n for n, (t, src) in volumes_of(obj, pod).items()
            if t == "secret" and src.get("secretName") == "lockstep-token"][0]


def make_volumes(objs, spec, pod_dir, token):
    obj, pod, _ = workload(objs, spec)
    fs_group = pod.get("securityContext", {}).get("fsGroup")
    for name, (kind, src) in volumes_of(obj, pod).items():
        d = os.path.join(pod_dir, "vol", name)
        os.makedirs(d)
        if kind == "secret":
            write_secret(d, src, fs_group, token, "..2026_01_01_00_00_00.000000001")
            for item in src["items"]:
                os.symlink(os.path.join("..data", item["path"]), os.path.join(d, item["path"]))
            os.symlink("..2026_01_01_00_00_00.000000001", os.path.join(d, "..data"))
            os.chmod(d, 0o1777)
        elif kind == "emptyDir":
            if fs_group is not None:
                os.chown(d, 0, fs_group)
                os.chmod(d, 0o2777)
            else:
                os.chmod(d, 0o777)
        elif kind == "persistentVolumeClaim":
            if fs_group is not None:
                os.chown(d, 0, fs_group)
                os.chmod(d, 0o2775)
            else:
                os.chmod(d, 0o755)
        else:
            die(f"volume {name}: type {kind} is not emulated here")


def expand(s, env):
    """Kubernetes' $(VAR) expansion of command, args and env values."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def container_env(c, pod_ip, node_name, pod_name, uid):
    fields = {"status.podIP": pod_ip, "spec.nodeName": node_name, "metadata.name": pod_name,
              "metadata.namespace": "lockstep", "status.hostIP": pod_ip}
    env = {"PATH": DEFAULT_PATH, "HOSTNAME": pod_name, "HOME": "/root" if uid == 0 else "/"}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            die(f"env {e['name']}: only values and fieldRefs are emulated")
    return env


def map_paths(s, mounts):
    """Rewrites container paths under a mountPath to the volume's directory."""
    for path in sorted(mounts, key=len, reverse=True):
        s = re.sub(re.escape(path) + r"(?=/|$|:)", mounts[path], s)
    return s


def prepare(objs, spec, name, pod_dir, pod_ip, node_name, pod_name, image_root):
    obj, pod, _ = workload(objs, spec)
    c = container(pod, name)
    sec = security(pod, c)
    uid = sec.get("runAsUser", 0)  # the image runs as root
    if sec.get("runAsNonRoot") and uid == 0:
        die(f"{name}: runAsNonRoot with uid 0: the kubelet would refuse to start it")
    gid = sec.get("runAsGroup", 0)
    groups = [g for g in [sec.get("fsGroup")] + sec["supplementalGroups"] if g is not None]
    mounts = {m["mountPath"]: os.path.join(pod_dir, "vol", m["name"])
              for m in c.get("volumeMounts", [])}
    env = container_env(c, pod_ip, node_name, pod_name, uid)
    argv = [expand(a, env) for a in argv_of(c)]
    argv = [map_paths(a, mounts) for a in argv]
    argv[0] = image_root + argv[0] if os.path.exists(image_root + argv[0]) else argv[0]
    env = {k: map_paths(v, mounts) for k, v in env.items()}
    caps = sec.get("capabilities", {})
    if caps.get("drop") != ["ALL"]:
        die(f"{name}: only capabilities.drop [ALL] is emulated")
    bounding = ",".join(["-all"] + ["+" + a.lower() for a in caps.get("add", [])])
    priv = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}",
            f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
            f"--bounding-set={bounding}", "--inh-caps=-all", "--ambient-caps=-all"]
    if sec.get("allowPrivilegeEscalation") is False:
        priv.append("--no-new-privs")
    envv = ["/usr/bin/env", "-i"] + [f"{k}={v}" for k, v in env.items()]
    return c, sec, mounts, envv + priv + ["--"] + argv


def run_cmd(objs, spec, name, pod_dir, netns, pod_ip, node_name, pod_name, image_root):
    c, sec, mounts, inner = prepare(objs, spec, name, pod_dir, pod_ip, node_name, pod_name,
                                    image_root)
    setup = ["set -e"]
    for m, d in mounts.items():
        ro = any(vm["mountPath"] == m and vm.get("readOnly") for vm in c["volumeMounts"])
        setup.append(f"mount --bind {shlex.quote(d)} {shlex.quote(d)}")
        if ro:
            setup.append(f"mount -o remount,bind,ro {shlex.quote(d)}")
    if sec.get("readOnlyRootFilesystem"):
        setup.append("mount -o remount,bind,ro /")
    setup.append("mount -t tmpfs -o mode=1777,size=64m,nosuid,nodev,noexec shm /dev/shm")
    setup.append('exec "$@"')
    return (["ip", "netns", "exec", netns, "unshare", "--mount", "--pid", "--fork",
             "--mount-proc", "--kill-child=SIGTERM", "--propagation", "private",
             "/bin/sh", "-c", "\n".join(setup), "sh"] + inner)


def exec_cmd(objs, spec, name, pod_dir, pod_ip, node_name, pod_name, image_root, pid, argv):
    _, _, mounts, inner = prepare(objs, spec, name, pod_dir, pod_ip, node_name, pod_name,
                                  image_root)
    sep = inner.index("--")
    return (["nsenter", "-t", pid, "-m", "-p", "-n", "--"] + inner[:sep + 1] +
            [map_paths(a, mounts) for a in argv])


def probes(objs, spec, name):
    _, pod, _ = workload(objs, spec)
    c = container(pod, name)
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in c:
            g = c[kind]["grpc"]
            print(kind, g["port"], g.get("service", ""))


CAP_NUMBERS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4,
               "KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10,
               "NET_RAW": 13, "SYS_CHROOT": 18, "SYS_NICE": 23, "MKNOD": 27, "AUDIT_WRITE": 29,
               "SETFCAP": 31}


def caps(objs, spec, name):
    _, pod, _ = workload(objs, spec)
    added = security(pod, container(pod, name)).get("capabilities", {}).get("add", [])
    print(f"{sum(1 << CAP_NUMBERS[c] for c in added):016x}")


def netpol(objs, pods):
    """NetworkPolicy ingress rules as iptables, in each pod's netns."""
    parsed = []
    for p in pods:
        netns, ip, node_ip, spec = p.split(",", 3)
        _, _, labels = workload(objs, spec)
        parsed.append((netns, ip, node_ip, labels))
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    for netns, ip, node_ip, labels in parsed:
        selecting = [o["spec"] for o in policies if matches(o["spec"]["podSelector"], labels)]
        rules = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
        if selecting:
            rules[1] = ":INPUT DROP [0:0]"
            rules += ["-A INPUT -i lo -j ACCEPT",
                      "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
                      # Traffic from the pod's node (the kubelet's probes).
                      f"-A INPUT -s {node_ip} -j ACCEPT"]
        for spec in selecting:
            if spec.get("policyTypes") != ["Ingress"]:
                die(f"policyTypes {spec.get('policyTypes')}: only Ingress is emulated")
            for rule in spec.get("ingress", []):
                sources = [None]
                if "from" in rule:
                    sources = []
                    for peer in rule["from"]:
                        if set(peer) != {"podSelector"}:
                            die(f"peer {peer}: only podSelector is emulated")
                        sources += [pip for _, pip, _, pl in parsed
                                    if matches(peer["podSelector"], pl)]
                ports = [None]
                if "ports" in rule:
                    ports = []
                    for port in rule["ports"]:
                        if port.get("protocol", "TCP") != "TCP" or not isinstance(port.get("port"), int):
                            die(f"port {port}: only numbered TCP ports are emulated")
                        ports.append(port["port"])
                for src in sources:
                    for port in ports:
                        r = "-A INPUT"
                        if src:
                            r += f" -s {src}"
                        if port:
                            r += f" -p tcp --dport {port}"
                        rules.append(r + " -j ACCEPT")
        rules.append("COMMIT")
        subprocess.run(["ip", "netns", "exec", netns, "iptables-restore"],
                       input="\n".join(rules) + "\n", text=True, check=True)
        print(f"{netns} ({ip}): {len(rules) - 5} rules" if selecting else f"{netns} ({ip}): open")


def health(address, service=""):
    import grpc
    # Debian's python3-grpcio has no grpc_health stubs: HealthCheckRequest
    # is field 1 (service, a string); the answer's status is field 1
    # (1 SERVING, 2 NOT_SERVING).
    req = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
    ch = grpc.insecure_channel(address)
    check = ch.unary_unary("/grpc.health.v1.Health/Check",
                           request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        resp = check(req, timeout=2)
    except grpc.RpcError as e:
        print(f"{e.code().name}")
        return
    print({b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}.get(resp, repr(resp)))


def main(args):
    if not args:
        die(__doc__)
    cmd, rest = args[0], args[1:]
    if cmd == "health":
        health(*rest)
        return
    objs = load(rest[0])
    if cmd == "check":
        check(objs, "--gpu" in rest[1:])
    elif cmd == "volumes":
        make_volumes(objs, *rest[1:])
    elif cmd == "update-secrets":
        update_secrets(objs, *rest[1:])
    elif cmd == "run":
        sys.stdout.write("\0".join(run_cmd(objs, *rest[1:])) + "\0")
    elif cmd == "exec":
        sep = rest.index("--")
        sys.stdout.write("\0".join(exec_cmd(objs, *rest[1:sep], rest[sep + 1:])) + "\0")
    elif cmd == "probes":
        probes(objs, *rest[1:])
    elif cmd == "caps":
        caps(objs, *rest[1:])
    elif cmd == "netpol":
        netpol(objs, rest[1:])
    else:
        die(f"unknown subcommand {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
