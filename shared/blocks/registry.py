"""The block registry: which block types exist, and what each declares about itself.

A block module exposes `SPECS: tuple[BlockSpec, ...]`; the first lookup (`get`,
`is_registered`, `all_specs`) imports every module in `CATALOG` and registers its specs, so
callers never load it themselves. Nothing is tolerated silently: a module that fails to
import, lacks `SPECS`, or declares a spec the registry refuses stops the load with an error
(and the next lookup tries again).

The registry refuses a descriptor that creates records at a provider unless it declares itself
`at_most_once` (DESIGN invariant 10): a create that retried blindly after a lost response
would make a duplicate record, the one failure onceflow promises never to hide.
"""

from __future__ import annotations

import functools
import importlib
import threading

from shared.blocks.base import NO_RETRY, BlockSpec, Gate

# Block modules, in load order. Each must define SPECS.
CATALOG: tuple[str, ...] = (
    "shared.blocks.flow",
    "shared.blocks.waits",
    "shared.blocks.crm",
    "shared.blocks.http",
    "shared.blocks.ai",
)


class RegistryError(ValueError):
    """A block descriptor the registry refuses to load."""


class UnknownBlockType(KeyError):
    """No block of that type is registered."""

    def __init__(self, type_name: str) -> None:
        super().__init__(type_name)
        self.type_name = type_name

    def __str__(self) -> str:
        known = ", ".join(sorted(_SPECS)) or "none loaded"
        return f"unknown block type {self.type_name!r} (known: {known})"


_SPECS: dict[str, BlockSpec] = {}
_LOCK = threading.Lock()


def check_spec(spec: BlockSpec) -> None:
    """Raise `RegistryError` when a descriptor breaks a rule the engine relies on."""
    if spec.creates and spec.side_effect != "at_most_once":
        raise RegistryError(
            f"block {spec.type_name!r} creates records but declares side_effect="
            f"{spec.side_effect!r}; a create must be 'at_most_once' (a retry after a lost "
            "response would duplicate the record)"
        )
    if spec.kind == "flow" and (spec.side_effect != "none" or spec.retry != NO_RETRY):
        raise RegistryError(
            f"flow-control block {spec.type_name!r} must have side_effect='none' and no retries"
        )
    if spec.priced and Gate.CHARGE not in spec.gates:
        raise RegistryError(
            f"block {spec.type_name!r} has price {spec.price} (per 1k tokens: "
            f"{spec.token_price and spec.token_price.per_1k_tokens}) but does not declare the "
            "charge gate: the executor would never charge it"
        )
    if spec.token_price is not None and spec.token_price.per_1k_tokens <= 0:
        raise RegistryError(f"block {spec.type_name!r} has a token price that is not positive")
    limits = {Gate.CONNECTION_LIMIT, Gate.HOST_LIMIT}
    if spec.gates & limits and spec.target is None:
        raise RegistryError(
            f"block {spec.type_name!r} declares a connection or host limit but no target to "
            "key it on"
        )
    if spec.price < 0:
        raise RegistryError(f"block {spec.type_name!r} has a negative price {spec.price}")
    if not spec.type_name or spec.type_name != spec.type_name.strip():
        raise RegistryError(f"invalid block type name {spec.type_name!r}")


def register(spec: BlockSpec) -> None:
    """Add a block type. Registering the same descriptor again is a no-op; a different
    descriptor under a taken name is an error."""
    check_spec(spec)
    with _LOCK:
        existing = _SPECS.get(spec.type_name)
        if existing is not None and existing != spec:
            raise RegistryError(f"block type {spec.type_name!r} is already registered")
        _SPECS[spec.type_name] = spec


@functools.cache
def _catalog_loaded() -> None:
    """The catalog, loaded by the first lookup of the process. Not cached when the load
    raises; two threads that both miss both load, which is harmless (registering the same
    descriptor again is a no-op) and neither returns before the whole catalog is in."""
    load_catalog(CATALOG)


def get(type_name: str) -> BlockSpec:
    _catalog_loaded()
    try:
        return _SPECS[type_name]
    except KeyError:
        raise UnknownBlockType(type_name) from None


def is_registered(type_name: str) -> bool:
    _catalog_loaded()
    return type_name in _SPECS


def all_specs() -> list[BlockSpec]:
    _catalog_loaded()
    return [_SPECS[name] for name in sorted(_SPECS)]


def load_module(module_name: str) -> None:
    module = importlib.import_module(module_name)
    specs = getattr(module, "SPECS", None)
    if not isinstance(specs, tuple) or not all(isinstance(s, BlockSpec) for s in specs):
        raise RegistryError(f"block module {module_name} must define SPECS: tuple[BlockSpec, ...]")
    for spec in specs:
        register(spec)


def load_catalog(modules: tuple[str, ...] = CATALOG) -> list[BlockSpec]:
    """Import every catalog module and register its specs; every failure is raised. The
    lookups call it on first use; tests call it with a list of their own."""
    for module_name in modules:
        load_module(module_name)
    return [_SPECS[name] for name in sorted(_SPECS)]
