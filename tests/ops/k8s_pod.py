#!/usr/bin/env python3
"""k8s_pod.py STATEFULSET IMAGE CLAIM [SECRET_DIR] - prints what `podman
kube play` can run of a StatefulSet (podman has no StatefulSet): pod 0 of
it, i.e. its pod template unchanged, named <statefulset>-0, with IMAGE, and
one PersistentVolumeClaim per volumeClaimTemplate (the first one named
CLAIM) mounted where the template mounts it.

With SECRET_DIR, every secret volume becomes a hostPath volume of that
directory: podman 4.3 shows a Secret's keys as mode 0644 files whatever
defaultMode and fsGroup say, so tests/container/run.sh lays the token out
there as the kubelet does (root-owned, group fsGroup, defaultMode, behind
..data symlinks) and mounts that."""
import sys

import yaml


def main():
    path, image, claim = sys.argv[1:4]
    secret_dir = sys.argv[4] if len(sys.argv) > 4 else None
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    sts = next(d for d in docs if d.get("kind") == "StatefulSet")
    tmpl = sts["spec"]["template"]
    pod_spec = dict(tmpl["spec"])
    pod_spec["containers"] = [dict(c, image=image)
                              for c in pod_spec["containers"]]
    volumes = [v if not (secret_dir and "secret" in v) else
               {"name": v["name"],
                "hostPath": {"path": secret_dir, "type": "Directory"}}
               for v in pod_spec.get("volumes", [])]
    out = []
    for i, vct in enumerate(sts["spec"].get("volumeClaimTemplates", [])):
        name = claim if i == 0 else "%s-%d" % (claim, i)
        out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": name},
                    "spec": vct["spec"]})
        volumes.append({"name": vct["metadata"]["name"],
                        "persistentVolumeClaim": {"claimName": name}})
    pod_spec["volumes"] = volumes
    meta = dict(tmpl.get("metadata", {}))
    meta["name"] = sts["metadata"]["name"] + "-0"
    out.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": pod_spec})
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
