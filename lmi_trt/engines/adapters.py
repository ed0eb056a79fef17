"""The registered-adapter table every ``AdapterHost`` keeps: names to what the engine read, with the rules that are
the same on every engine (a name once; at most ``option.max_cpu_loras``; unknown names a 404; an adapter in use a
409 until its requests finish). What an adapter is read into is the engine's own (``V``)."""

from __future__ import annotations

from typing import Generic, TypeVar

from .base import AdapterInfo, EngineError

V = TypeVar("V")


def unknown(name: str) -> EngineError:
    return EngineError(f"LoRA adapter {name!r} is not registered", code=404, field="adapter")


class AdapterTable(Generic[V]):
    """Registered adapters by name; ``off``: why adapters are refused (None: they are on)."""

    def __init__(self, *, max_cpu_loras: int | None, off: str | None = None) -> None:
        self.max_cpu_loras = max_cpu_loras
        self.off = off
        self._entries: dict[str, tuple[AdapterInfo, V]] = {}

    def infos(self) -> list[AdapterInfo]:
        return [info for info, _ in self._entries.values()]

    def check_new(self, name: str) -> None:
        """Before reading an adapter: 400 when adapters are off, 409 for a name taken or a full table."""
        if self.off is not None:
            raise EngineError(f"LoRA adapters are off: {self.off}", code=400, field="adapter")
        if name in self._entries:
            raise EngineError(f"LoRA adapter {name!r} is registered already; unregister it first", code=409)
        if self.max_cpu_loras is not None and len(self._entries) >= self.max_cpu_loras:
            raise EngineError(
                f"option.max_cpu_loras={self.max_cpu_loras} adapters are registered; unregister one first, or "
                "raise option.max_cpu_loras",
                code=409,
            )

    def add(self, info: AdapterInfo, value: V) -> None:
        """After reading it (off the event loop): the checks again, as another registration may have come first."""
        self.check_new(info.name)
        self._entries[info.name] = (info, value)

    def get(self, name: str) -> V:
        found = self._entries.get(name)
        if found is None:
            raise unknown(name)
        return found[1]

    def remove(self, name: str, in_use: int) -> V:
        """404 for a name not registered; 409 while ``in_use`` requests generate with it."""
        if name not in self._entries:
            raise unknown(name)
        if in_use:
            raise EngineError(
                f"LoRA adapter {name!r} is in use by {in_use} request(s); unregister it once they finish", code=409
            )
        return self._entries.pop(name)[1]
