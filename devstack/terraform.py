"""What `infra/` declares, read from the Terraform itself so the local stack cannot drift.

The local stack needs three facts the cloud deployment also depends on: which Pub/Sub topics
and push subscriptions exist (with their retry and dead-letter policies), and at which cron
cadence Cloud Scheduler calls each scheduled function. They are read from `infra/*.tf` with
python-hcl2 and a deliberately small evaluator: literals, `var.x` defaults, `local.x`,
`each.key`/`each.value` of a literal `for_each` (also as an index, `x[each.key]`), string
interpolation, and references to other resources. A reference to a function resource
resolves to the function's name (its `entry_point`, or the `for_each` key), which is how a push
endpoint or a scheduler target names the function it calls. Anything the evaluator cannot read
raises `InfraUnreadable` naming the file and the expression, instead of guessing.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

INFRA_DIR = Path(__file__).resolve().parent.parent / "infra"
FUNCTION_TYPES = ("google_cloudfunctions2_function", "google_cloud_run_v2_service")


class InfraUnreadable(RuntimeError):
    """infra/ says something the local stack cannot interpret."""


@dataclass(frozen=True)
class Ref:
    """A reference to (an instance of) a resource: `type.name[key].attr…`."""

    rtype: str
    name: str
    key: str | None
    attrs: tuple[str, ...]


@dataclass(frozen=True)
class Instance:
    rtype: str
    name: str
    key: str | None
    body: Mapping[str, Any]
    file: str

    @property
    def address(self) -> str:
        return f"{self.rtype}.{self.name}" + (f'["{self.key}"]' if self.key is not None else "")


@dataclass
class Declarations:
    """Every resource instance, variable default and local in infra/."""

    instances: list[Instance] = field(default_factory=list)
    variables: dict[str, Any] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)

    def of_type(self, rtype: str) -> Iterator[Instance]:
        return (i for i in self.instances if i.rtype == rtype)

    def find(self, ref: Ref) -> Instance:
        matches = [i for i in self.instances if i.rtype == ref.rtype and i.name == ref.name]
        if ref.key is not None:
            matches = [i for i in matches if i.key == ref.key]
        if len(matches) != 1:
            raise InfraUnreadable(f"cannot resolve {ref.rtype}.{ref.name} in infra/")
        return matches[0]


def _parse(path: Path) -> dict[str, Any]:
    import hcl2
    from hcl2 import SerializationOptions

    opts = SerializationOptions(strip_string_quotes=True, explicit_blocks=False)
    try:
        return dict(hcl2.loads(path.read_text("utf-8"), serialization_options=opts))
    except Exception as exc:
        raise InfraUnreadable(f"{path.name}: python-hcl2 could not parse it: {exc}") from exc


@cache
def load(infra_dir: Path = INFRA_DIR) -> Declarations:
    decl = Declarations()
    raw: list[tuple[str, dict[str, Any]]] = [
        (p.name, _parse(p)) for p in sorted(infra_dir.glob("*.tf"))
    ]
    for _, doc in raw:
        for block in doc.get("variable", []):
            for name, body in block.items():
                if isinstance(body, Mapping) and "default" in body:
                    decl.variables[name] = body["default"]
        for block in doc.get("locals", []):
            decl.locals.update(block)
    for fname, doc in raw:
        for block in doc.get("resource", []):
            for rtype, named in block.items():
                for name, body in named.items():
                    decl.instances.extend(_expand(decl, rtype, name, body, fname))
    return decl


def _expand(
    decl: Declarations, rtype: str, name: str, body: Mapping[str, Any], fname: str
) -> Iterator[Instance]:
    if "for_each" not in body:
        yield Instance(rtype, name, None, body, fname)
        return
    try:
        each = Evaluator(decl, fname).value(body["for_each"])
    except InfraUnreadable:
        # A computed for_each (a `for` expression, say) on a resource the local stack never
        # asks about. Kept unexpanded; resolving a reference into it fails with a clear error.
        yield Instance(rtype, name, None, body, fname)
        return
    if isinstance(each, Mapping):
        items = list(each.items())
    elif isinstance(each, list | tuple | set):
        items = [(str(v), v) for v in each]
    else:
        raise InfraUnreadable(f"{fname}: for_each of {rtype}.{name} is not a literal map or set")
    for key, value in items:
        yield Instance(rtype, name, str(key), {**body, "__each__": (str(key), value)}, fname)


_INTERP = re.compile(r"\$\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")
_SEGMENT = re.compile(r'\.([A-Za-z_][A-Za-z0-9_-]*)|\[\s*(?:"([^"]*)"|(\d+)|(each\.key))\s*\]')


class Evaluator:
    """Evaluates attribute values of one resource instance (see the module docstring)."""

    def __init__(self, decl: Declarations, file: str, instance: Instance | None = None) -> None:
        self.decl = decl
        self.file = file
        self.each: tuple[str, Any] | None = (
            instance.body.get("__each__") if instance is not None else None
        )

    def value(self, v: Any) -> Any:
        if isinstance(v, str):
            return self.string(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, Mapping):
            return {k: self.value(x) for k, x in v.items()}
        return v

    def string(self, text: str) -> Any:
        whole = _INTERP.fullmatch(text)
        if whole:
            return self.expression(whole[1].strip())

        def substitute(m: re.Match[str]) -> str:
            got = self.expression(m[1].strip())
            if isinstance(got, Ref) and got.attrs == ("name",):
                got = resource_name(self.decl, got, "name")
            if isinstance(got, Ref):
                raise InfraUnreadable(
                    f"{self.file}: `{m[0]}` interpolates a resource attribute into a string"
                )
            return str(got)

        return _INTERP.sub(substitute, text)

    def expression(self, expr: str) -> Any:
        if len(expr) >= 2 and expr[0] == expr[-1] == '"':
            return self.string(expr[1:-1])
        if re.fullmatch(r"-?\d+", expr):
            return int(expr)
        if expr.startswith("base64encode(") and expr.endswith(")"):
            inner = self.expression(expr[len("base64encode(") : -1].strip())
            if not isinstance(inner, str):
                raise InfraUnreadable(f"{self.file}: cannot read the expression `{expr}`")
            return base64.b64encode(inner.encode()).decode()
        for fn in ("toset", "tolist", "tomap"):
            if expr.startswith(fn + "(") and expr.endswith(")"):
                return self.expression(expr[len(fn) + 1 : -1].strip())
        if expr.startswith("[") and expr.endswith("]"):
            inner = expr[1:-1].strip()
            return [self.expression(p.strip()) for p in inner.split(",") if p.strip()]
        head = re.match(r"[A-Za-z_][A-Za-z0-9_-]*", expr)
        if head is None:
            raise InfraUnreadable(f"{self.file}: cannot read the expression `{expr}`")
        path: list[Any] = [head[0]]
        rest = expr[head.end() :]
        while rest:
            m = _SEGMENT.match(rest)
            if m is None:
                raise InfraUnreadable(f"{self.file}: cannot read the expression `{expr}`")
            if m[4] is not None:  # an index by the instance's own for_each key
                if self.each is None:
                    raise InfraUnreadable(f"{self.file}: `{expr}` outside a for_each")
                path.append(self.each[0])
            else:
                path.append(m[1] if m[1] is not None else (m[2] if m[2] is not None else int(m[3])))
            rest = rest[m.end() :]
        return self._path(expr, path)

    def _path(self, expr: str, path: list[Any]) -> Any:
        root = path[0]
        if root == "var" and len(path) >= 2:
            if path[1] not in self.decl.variables:
                raise InfraUnreadable(f"{self.file}: variable {path[1]} has no default")
            return _walk(self.value(self.decl.variables[path[1]]), path[2:], expr, self.file)
        if root == "local" and len(path) >= 2:
            if path[1] not in self.decl.locals:
                raise InfraUnreadable(f"{self.file}: no local named {path[1]}")
            return _walk(self.value(self.decl.locals[path[1]]), path[2:], expr, self.file)
        if root == "each" and len(path) >= 2:
            if self.each is None:
                raise InfraUnreadable(f"{self.file}: `{expr}` outside a for_each")
            base = self.each[0] if path[1] == "key" else self.each[1]
            return _walk(self.value(base), path[2:], expr, self.file)
        if len(path) >= 2 and isinstance(path[1], str) and "_" in root:
            key: str | None = None
            attrs = path[2:]
            if attrs and (isinstance(attrs[0], int) or self._is_keyed(root, path[1])):
                key = str(attrs[0])
                attrs = attrs[1:]
            return Ref(root, path[1], key, tuple(str(a) for a in attrs))
        raise InfraUnreadable(f"{self.file}: cannot read the expression `{expr}`")

    def _is_keyed(self, rtype: str, name: str) -> bool:
        return any(
            i.key is not None for i in self.decl.instances if (i.rtype, i.name) == (rtype, name)
        )


def _walk(value: Any, path: list[Any], expr: str, file: str) -> Any:
    for p in path:
        try:
            value = value[p]
        except (KeyError, IndexError, TypeError):
            raise InfraUnreadable(f"{file}: cannot read the expression `{expr}`") from None
    return value


def block(body: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """A nested block (hcl2 gives a list of one dict) or None when absent."""
    got = body.get(name)
    if isinstance(got, list):
        return got[0] if got else None
    if isinstance(got, Mapping):
        return got
    return None


def attribute(decl: Declarations, inst: Instance, *path: str) -> Any:
    """The evaluated value of a (possibly nested) attribute of `inst`, or None."""
    node: Any = inst.body
    for p in path[:-1]:
        node = block(node, p)
        if node is None:
            return None
    if path[-1] not in node:
        return None
    return Evaluator(decl, inst.file, inst).value(node[path[-1]])


def function_name(decl: Declarations, ref: Any, known: tuple[str, ...]) -> str:
    """The onceflow function a reference (or a literal URL) points at."""
    if isinstance(ref, Ref) and ref.rtype in FUNCTION_TYPES:
        inst = decl.find(ref)
        candidates = (
            lambda: attribute(decl, inst, "build_config", "entry_point"),
            lambda: inst.key,
            lambda: inst.name,
            lambda: attribute(decl, inst, "name"),
        )
        for candidate in candidates:
            try:
                got = candidate()
            except InfraUnreadable:
                continue
            for name in known:
                if isinstance(got, str) and got in (name, name.replace("_", "-")):
                    return name
    if isinstance(ref, str):
        # A literal URL: the function whose name it carries, longest name first.
        for name in sorted(known, key=len, reverse=True):
            if name in ref or name.replace("_", "-") in ref:
                return name
    raise InfraUnreadable(f"cannot tell which function {ref!r} points at")


def resource_name(decl: Declarations, ref: Any, what: str) -> str:
    """The `name` of the resource `ref` points at (a topic, say), or a literal name/path."""
    if isinstance(ref, Ref):
        inst = decl.find(ref)
        got = attribute(decl, inst, "name")
        if isinstance(got, str):
            return got
        raise InfraUnreadable(f"{inst.file}: {inst.address} has no literal name")
    if isinstance(ref, str) and ref:
        return ref.rsplit("/", 1)[-1]
    raise InfraUnreadable(f"cannot read the {what} {ref!r}")
