#!/usr/bin/env python3
"""Writes a CRD's openAPIV3Schema (one version) as compact JSON, without the `description`
fields (documentation only: validation is unchanged, the file is a fraction of the size).

    extract.py CRD.yaml VERSION OUT.json
"""
import json
import sys

import yaml


def strip(node):
    if isinstance(node, dict):
        # `description` is documentation, except where it names a property (a field of an
        # object called "description" lives under `properties`, handled by the caller).
        return {
            k: (strip_props(v) if k == "properties" else strip(v))
            for k, v in node.items()
            if k != "description"
        }
    if isinstance(node, list):
        return [strip(x) for x in node]
    return node


def strip_props(props):
    return {name: strip(schema) for name, schema in props.items()}


def main():
    crd_path, version, out = sys.argv[1:4]
    with open(crd_path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    crd = next(d for d in docs if d.get("kind") == "CustomResourceDefinition")
    ver = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = strip(ver["schema"]["openAPIV3Schema"])
    doc = {
        "group": crd["spec"]["group"],
        "kind": crd["spec"]["names"]["kind"],
        "version": version,
        "openAPIV3Schema": schema,
    }
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"), sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
