"""The Google provider's schema, offline: what `terraform validate` would check `infra/` against.

`terraform init` can't download the google provider here, so `terraform validate` can't run.
The provider's schema is published another way too: the npm package `@cdktf/provider-google`
is generated from it, and its `.jsii` file describes every resource's and data source's
configuration type — each argument and nested block with its Terraform name (in the docs link
every property carries: `…/docs/resources/<type>#<argument>`) and whether it is optional.
Computed-only attributes are not in a configuration type, so "not in the schema" means "not
settable", exactly what validate reports.

`load()` fetches the pinned package once with `npm pack` (the npm registry is reachable from
developers' machines and CI), reduces the 99 MB `.jsii` to the resources' argument trees and
caches that in `.cache/` beside the repo. The version is the one `infra/versions.tf` allows
(`~> 6.0`) and the package was generated from (google provider 6.50.0).
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

PACKAGE = "@cdktf/provider-google"
PACKAGE_VERSION = "16.12.1"  # generated from hashicorp/google 6.50.0
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / f"provider-google-{PACKAGE_VERSION}.schema.json"

# `…/docs/resources/cloudfunctions2_function#build_config Cloudfunctions2Function#build_config}`
_DOC_LINK = re.compile(r"/docs/(resources|data-sources)/([a-z0-9_]+)#([a-z0-9_]+)")
_CONFIG = re.compile(r"^@cdktf/provider-google\.[A-Za-z0-9]+\.[A-Za-z0-9]+Config$")

# An argument: {"optional": bool, "block": <argument tree> | None}. A block's tree is the
# same shape: {"args": {name: argument}}.
Schema = dict[str, dict[str, Any]]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _block_fqn(jtype: Any, types: dict[str, Any]) -> str | None:
    """The nested block's configuration type inside a property's type (direct, a list of it,
    or a union with `IResolvable`), or None for a plain attribute."""
    if not isinstance(jtype, dict):
        return None
    fqn = jtype.get("fqn")
    if isinstance(fqn, str):
        found = types.get(fqn)
        return fqn if found and found.get("datatype") else None
    if "collection" in jtype:
        return _block_fqn(jtype["collection"].get("elementtype"), types)
    if "union" in jtype:
        for member in jtype["union"].get("types", []):
            inner = _block_fqn(member, types)
            if inner:
                return inner
    return None


def _tree(fqn: str, types: dict[str, Any], seen: frozenset[str] = frozenset()) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for prop in types[fqn].get("properties", []):
        link = _DOC_LINK.search(prop.get("docs", {}).get("remarks", ""))
        name = link.group(3) if link else _snake(prop["name"])
        inner = _block_fqn(prop["type"], types)
        block = _tree(inner, types, seen | {fqn}) if inner and inner not in seen else None
        args[name] = {"optional": bool(prop.get("optional")), "block": block}
    return {"args": args}


def reduce_jsii(jsii: dict[str, Any]) -> dict[str, Schema]:
    """`{"resource": {type: tree}, "data": {type: tree}}` from the package's `.jsii`."""
    types: dict[str, Any] = jsii["types"]
    out: dict[str, Schema] = {"resource": {}, "data": {}}
    for fqn, jtype in types.items():
        # A resource's or data source's own configuration type, not a nested block whose name
        # happens to end in Config (`PubsubSubscriptionPushConfig`).
        if not _CONFIG.match(fqn) or "cdktf.TerraformMetaArguments" not in jtype.get(
            "interfaces", []
        ):
            continue
        for prop in jtype.get("properties", []):
            link = _DOC_LINK.search(prop.get("docs", {}).get("remarks", ""))
            if link:
                kind = "resource" if link.group(1) == "resources" else "data"
                out[kind][f"google_{link.group(2)}"] = _tree(fqn, types)
                break
    return out


def _fetch() -> dict[str, Schema]:
    with tempfile.TemporaryDirectory(prefix="provider-google-") as tmp:
        try:
            subprocess.run(
                ["npm", "pack", "--silent", f"{PACKAGE}@{PACKAGE_VERSION}"],
                cwd=tmp,
                check=True,
                capture_output=True,
                timeout=300,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(
                f"could not fetch {PACKAGE}@{PACKAGE_VERSION} with npm (needed to check infra/ "
                f"against the google provider's schema): {exc}"
            ) from exc
        (tgz,) = Path(tmp).glob("*.tgz")
        with tarfile.open(tgz) as archive:
            member = archive.extractfile("package/.jsii")
            if member is None:
                raise RuntimeError(f"{tgz.name} has no package/.jsii")
            return reduce_jsii(json.load(member))


def load() -> dict[str, Schema]:
    if CACHE.exists():
        cached: dict[str, Schema] = json.loads(CACHE.read_text("utf-8"))
        return cached
    schema = _fetch()
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    partial = CACHE.with_suffix(".partial")
    partial.write_text(json.dumps(schema, separators=(",", ":")), "utf-8")
    partial.replace(CACHE)
    return schema


# Meta-arguments Terraform itself takes on every resource or data block.
META_ARGUMENTS = frozenset(
    {"count", "for_each", "depends_on", "lifecycle", "provider", "provisioner", "connection"}
)


def check_block(body: dict[str, Any], tree: dict[str, Any], where: str) -> list[str]:
    """Every problem `terraform validate` would report for `body` (python-hcl2's reading of a
    block, nested blocks as lists of dicts) against its argument tree."""
    problems: list[str] = []
    args: dict[str, Any] = tree["args"]
    given = {k for k in body if not k.startswith("__")}
    for key in sorted(given):
        if key in META_ARGUMENTS and where.count(".") <= 1:
            continue
        if key == "dynamic":
            for dyn in body[key]:
                for name, spec in dyn.items():
                    arg = args.get(name)
                    if arg is None or arg["block"] is None:
                        problems.append(f"{where}: dynamic {name!r} is not a block here")
                        continue
                    for content in spec.get("content", []):
                        problems += check_block(content, arg["block"], f"{where}.{name}")
            continue
        arg = args.get(key)
        if arg is None:
            problems.append(f"{where}: unsupported argument or block {key!r}")
            continue
        if arg["block"] is not None and isinstance(body[key], list):
            for item in body[key]:
                if isinstance(item, dict):
                    problems += check_block(item, arg["block"], f"{where}.{key}")
    dynamic_names = {name for dyn in body.get("dynamic", []) for name in dyn}
    for name, arg in sorted(args.items()):
        if not arg["optional"] and name not in given and name not in dynamic_names:
            problems.append(f"{where}: missing required argument {name!r}")
    return problems
