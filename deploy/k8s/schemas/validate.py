#!/usr/bin/env python3
"""Checks Kubernetes manifests offline against the CRD schemas stored beside this file.

    validate.py MANIFEST.yaml...

Each document whose apiVersion/kind matches a stored schema (*.json, written by extract.py)
is validated; other kinds (Service, ConfigMap) are listed as not checked. Exit 1 with one
line per error (file, document, field path, message), 0 when all pass.

The CRDs are OpenAPI v3 schemas with Kubernetes extensions; before validating, this
translates the ones that matter: `x-kubernetes-int-or-string` (integer or string),
`nullable`, and, like `kubectl apply --validate=strict`, an unknown field is an error
(objects with `properties` and no `x-kubernetes-preserve-unknown-fields` get
`additionalProperties: false`). CEL rules (`x-kubernetes-validations`) are not evaluated.
Needs the `jsonschema` and `PyYAML` packages.
"""
import glob
import json
import os
import sys

import jsonschema
import yaml


def k8s_to_jsonschema(node):
    if isinstance(node, list):
        return [k8s_to_jsonschema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "properties":
            out[k] = {name: k8s_to_jsonschema(s) for name, s in v.items()}
        else:
            out[k] = k8s_to_jsonschema(v)
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in out
    ):
        out["additionalProperties"] = False
    return out


def load_schemas():
    here = os.path.dirname(os.path.abspath(__file__))
    schemas = {}
    for path in sorted(glob.glob(os.path.join(here, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        key = (f"{d['group']}/{d['version']}", d["kind"])
        schemas[key] = k8s_to_jsonschema(d["openAPIV3Schema"])
    return schemas


def field_path(err):
    p = ".".join(str(x) for x in err.absolute_path)
    return p or "(document)"


def main(paths):
    schemas = load_schemas()
    errors = 0
    for path in paths:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for i, doc in enumerate(docs):
            key = (doc.get("apiVersion"), doc.get("kind"))
            name = (doc.get("metadata") or {}).get("name", "?")
            where = f"{path}: document {i + 1} ({key[1]} {name})"
            schema = schemas.get(key)
            if schema is None:
                print(f"{where}: not checked (no stored schema for {key[0]} {key[1]})")
                continue
            validator = jsonschema.Draft7Validator(schema)
            found = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
            for e in found:
                print(f"{where}: at {field_path(e)}: {e.message}")
            errors += len(found)
            if not found:
                print(f"{where}: valid")
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
