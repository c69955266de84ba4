"""The table of checked accesses of one module: every access in the bounds-checked mode
(TRACER_CHECK_BOUNDS=1), and always the indices of gather and scatter, which are data.

Generated code checks every buffer access with the `check` macro of templates/bounds.ll.j2, which
names the access by a site number; on failure the native code leaves that number and the element
offset in its error record (RECORD_BYTES after the arena's temporaries) and stops. `Sites` assigns
the numbers at code generation and turns a record back into a message: which kernel, which
buffer (where it lives in the memory plan), which element, and the user's line of the
instruction the access was made for.
"""
from __future__ import annotations

from typing import NamedTuple

from tracer.ir.graph import Value
from tracer.ir.memory import MemoryPlan

RECORD_BYTES = 16  # the failed site + 1 (0: none) and the element offset, two i64

_KIND = {"parameter": "parameter", "output": "output", "arena": "arena temporary"}


class Site(NamedTuple):
    """A checked access. (A NamedTuple, not a frozen dataclass, whose methods generated at import
    took ~1 ms of every fresh process's tr.trace.)"""

    kernel: str
    buffer: str  # a description for the message
    count: int  # the buffer's element count
    access: str  # "read", "write" or "read-modify-write"
    line: str  # the user's line ('file.py:12') the access was made for, or ""


INDEX = "index"  # the access kind of a gather or scatter index check
CALLBACK = "callback"  # the site of a host callback, which fails when the Python code raised


class Sites:
    """The numbered checked accesses of one module; `every_access`: the bounds-checked mode (else
    only the index checks, which are always on)."""

    def __init__(self, plan: MemoryPlan, every_access: bool = True):
        self.plan = plan
        self.every_access = every_access
        self.sites: list[Site] = []

    def add(self, kernel: str, value: Value, access: str, line: str) -> int:
        """The site number of an access of `value`'s buffer (where it is written, for a write)."""
        location = (self.plan.write(value) if access != "read" else self.plan.read(value))
        where = _KIND[location.kind] + (f" at byte {location.index}" if location.kind == "arena"
                                        else f" {location.index}")
        buffer = f"%{value.name} ({value.type}, {where})"
        return self.add_internal(kernel, buffer, value.type.size, access, line)

    def add_internal(self, kernel: str, buffer: str, count: int, access: str, line: str) -> int:
        """The site number of an access of a buffer that is no value's (a kernel's own)."""
        self.sites.append(Site(kernel, buffer, count, access, line))
        return len(self.sites) - 1

    def add_index(self, kernel: str, operand: Value, axis: int, size: int, line: str) -> int:
        """The site number of the range check of the index operand `operand` into a dimension
        `axis` of `size` elements."""
        return self.add_internal(kernel, f"dimension {axis} (index operand %{operand.name}: "
                                 f"{operand.type})", size, INDEX, line)

    def add_callback(self, kernel: str, callback, line: str) -> int:
        """The site number of a host callback (its failure is the exception the Python code
        raised, which runtime/callbacks.py keeps)."""
        return self.add_internal(kernel, repr(callback), 0, CALLBACK, line)

    def is_callback(self, site: int) -> bool:
        return self.sites[site].access == CALLBACK

    def is_index(self, site: int) -> bool:
        return self.sites[site].access == INDEX

    def message(self, site: int, offset: int) -> tuple[str, str]:
        """What failed, and the user's line it is about ("" if unknown). For an index check,
        `offset` is the index."""
        s = self.sites[site]
        if s.access == INDEX:
            return (f"index {offset} is out of bounds for {s.buffer} with size {s.count}, in "
                    f"{s.kernel}; nothing was read or written at it and no argument was "
                    f"changed"), s.line
        return (f"bounds check failed in {s.kernel}: {s.access} of element {offset} of "
                f"{s.buffer}, which has {s.count} elements. Nothing outside a buffer was touched; "
                f"the kernel stopped before the access and no later kernel ran"), s.line


