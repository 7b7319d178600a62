#!/usr/bin/env python3
"""Writes kubeconform's offline schemas from Kubernetes' own OpenAPI v3 spec.

usage: kube-json-schemas.py SPEC_V3_DIR OUT_DIR

SPEC_V3_DIR is api/openapi-spec/v3 of the k8s.io/kubernetes module (`go mod download -json
k8s.io/kubernetes@v1.37.2` prints its Dir). For every kind the spec names (x-kubernetes-group-
version-kind) one standalone JSON schema is written as OUT_DIR/<kind><suffix>.json, the name
kubeconform's {{ .ResourceKind }}{{ .KindSuffix }} template asks for (deployment-apps-v1.json,
service-v1.json). The referenced definitions are copied in (#/definitions/...), and every object
with listed properties gets additionalProperties: false, so `kubeconform -strict` refuses fields
the API does not have (kubeconform's -strict itself only refuses duplicate keys and picks the
file). Python's standard library only.
"""

import json
import os
import sys

REF_PREFIX = "#/components/schemas/"


def load_definitions(spec_dir):
    """All components.schemas of every group-version file, by name."""
    defs = {}
    for name in sorted(os.listdir(spec_dir)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(spec_dir, name)) as f:
            doc = json.load(f)
        defs.update(doc.get("components", {}).get("schemas", {}))
    if not defs:
        sys.exit(f"no components.schemas under {spec_dir}: not an OpenAPI v3 spec directory")
    return defs


def convert(node, refs):
    """A copy of node with $refs pointing into #/definitions (their names added to refs),
    nullable as a null type, and objects closed to unlisted properties."""
    if isinstance(node, list):
        return [convert(x, refs) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith(REF_PREFIX):
            name = value[len(REF_PREFIX):]
            refs.add(name)
            out[key] = "#/definitions/" + name
        elif key == "nullable":
            continue
        else:
            out[key] = convert(value, refs)
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if "properties" in out and "additionalProperties" not in out and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def kind_suffix(group, version):
    """kubeconform's KindSuffix: -<version> for the core group, else -<group's first label>-<version>."""
    if not group:
        return "-" + version.lower()
    return "-" + group.split(".")[0].lower() + "-" + version.lower()


def standalone(defs, name):
    """The schema of definition name with every definition it reaches."""
    refs = set()
    root = convert(defs[name], refs)
    done, definitions = set(), {}
    while refs - done:
        ref = sorted(refs - done)[0]
        done.add(ref)
        if ref not in defs:
            sys.exit(f"{name}: reference to {ref}, which the spec does not define")
        definitions[ref] = convert(defs[ref], refs)
    root["definitions"] = definitions
    return root


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    spec_dir, out_dir = sys.argv[1], sys.argv[2]
    defs = load_definitions(spec_dir)
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for name, schema in sorted(defs.items()):
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            kind, group, version = gvk.get("kind", ""), gvk.get("group", ""), gvk.get("version", "")
            # Generic types (DeleteOptions, WatchEvent) list every group-version; one file per
            # kind and suffix is what kubeconform looks up, the first definition wins.
            path = os.path.join(out_dir, kind.lower() + kind_suffix(group, version) + ".json")
            if not kind or not version or path in written:
                continue
            with open(path, "w") as f:
                json.dump(standalone(defs, name), f, indent=1, sort_keys=True)
            written[path] = name
    print(f"{len(written)} schemas from {len(defs)} definitions into {out_dir}")


if __name__ == "__main__":
    main()
