#!/usr/bin/env node
// Validates Kubernetes objects against the API schema that the npm package
// kubernetes-models carries (Kubernetes 1.27), offline.
//
// Usage: kubectl kustomize deploy/k8s | node tools/k8s_validate/validate.js
//
// Reads multi-document YAML from stdin and checks every object:
//   - its apiVersion/kind is a built-in Kubernetes kind (an unknown kind or
//     group version is an error, not a skip);
//   - the object passes the kind's schema (types, formats, required fields);
//   - no field is unknown to the schema. kubernetes-models' validators accept
//     unknown fields (its schemas have no additionalProperties: false), so a
//     typo like `containers[0].comand` would pass them silently. This file
//     runs the same validator over a proxy of the object that records which
//     fields the validator looked up on each sub-object: a field it never
//     looked up is not in the schema. Maps (labels, resource limits, ...) are
//     iterated by the validator, which marks every key of them as known.
// Prints one line per object ("ok Kind/name") and, for each error,
// "error Kind/name: path: message"; exits 1 if any object failed, 2 on
// unreadable input.
"use strict";

const fs = require("fs");
const yaml = require("js-yaml");

function load(text) {
  try {
    return yaml.loadAll(text).filter((doc) => doc !== null && doc !== undefined);
  } catch (e) {
    console.error(`error: input is not YAML: ${e.message}`);
    process.exit(2);
  }
}

// The kubernetes-models class for apiVersion/kind, or an error string.
function modelFor(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string" || !apiVersion || !kind) {
    return { error: "no apiVersion or kind" };
  }
  if (!/^[a-z0-9.]*\/?v[0-9a-z]+$/.test(apiVersion)) {
    return { error: `unknown apiVersion ${apiVersion}` };
  }
  let mod;
  try {
    mod = require(`kubernetes-models/${apiVersion}`);
  } catch (e) {
    return { error: `unknown apiVersion ${apiVersion} (not a built-in Kubernetes group version)` };
  }
  const cls = Object.prototype.hasOwnProperty.call(mod, kind) ? mod[kind] : undefined;
  if (typeof cls !== "function" || cls.kind !== kind || cls.apiVersion !== apiVersion) {
    return { error: `unknown kind ${kind} in ${apiVersion}` };
  }
  return { cls };
}

// Wraps `data` (recursively) in proxies that record, per sub-object, the
// keys the validator looked up and whether it iterated the object's keys.
function recordingProxy(data, path, seen) {
  if (data === null || typeof data !== "object") return data;
  const entry = { keys: new Set(), iterated: false, data };
  seen.set(path, entry);
  const children = new Map();
  return new Proxy(data, {
    get(target, key, receiver) {
      if (typeof key !== "string") return Reflect.get(target, key, receiver);
      entry.keys.add(key);
      const value = Reflect.get(target, key, receiver);
      if (value === null || typeof value !== "object" || !Object.prototype.hasOwnProperty.call(target, key)) {
        return value;
      }
      if (!children.has(key)) {
        const sub = Array.isArray(target) ? `${path}[${key}]` : `${path}.${key}`;
        children.set(key, recordingProxy(value, sub, seen));
      }
      return children.get(key);
    },
    ownKeys(target) {
      entry.iterated = true;
      return Reflect.ownKeys(target);
    },
  });
}

// Fields of `data` that the validator never looked up (see the top).
function unknownFields(validate, data) {
  const seen = new Map();
  const proxy = recordingProxy(data, "", seen);
  try {
    validate.call(proxy);
  } catch (e) {
    // Schema errors are reported by the plain run; here only lookups count.
  }
  const unknown = [];
  for (const [path, entry] of seen) {
    if (Array.isArray(entry.data) || entry.iterated) continue;
    if (entry.keys.size === 0) continue;  // a free-form object: the schema says nothing of it
    for (const key of Object.keys(entry.data)) {
      if (!entry.keys.has(key)) unknown.push(`${path}.${key}`.replace(/^\./, ""));
    }
  }
  return unknown;
}

function main() {
  const docs = load(fs.readFileSync(0, "utf8"));
  if (docs.length === 0) {
    console.error("error: no objects on stdin");
    process.exit(2);
  }
  let failed = 0;
  for (const obj of docs) {
    const kind = obj && obj.kind;
    const name = (obj && obj.metadata && obj.metadata.name) || "(no name)";
    const what = `${kind || "(no kind)"}/${name}`;
    const errors = [];
    if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
      errors.push("not an object");
    } else {
      const { cls, error } = modelFor(obj.apiVersion, obj.kind);
      if (error) {
        errors.push(error);
      } else {
        try {
          new cls(obj).validate();
        } catch (e) {
          errors.push(`schema: ${e.message}`);
        }
        for (const field of unknownFields(cls.prototype.validate, obj)) {
          errors.push(`${field}: unknown field (not in the ${obj.apiVersion} ${kind} schema)`);
        }
      }
    }
    if (errors.length === 0) {
      console.log(`ok ${what}`);
    } else {
      failed++;
      for (const e of errors) console.log(`error ${what}: ${e}`);
    }
  }
  console.log(`${docs.length - failed} of ${docs.length} objects valid`);
  process.exit(failed === 0 ? 0 : 1);
}

main();
