"""Object code linked into this process's memory without LLVM: what a disk-cache hit needs to run
its program, so a process that finds its programs compiled never imports llvmlite (~50 ms of
import, against ~1 ms to link the seed step's objects here).

The objects are what runtime/jit.py emits for the host: ELF relocatable files for x86-64 in LLVM's
large code model, whose every reference -- to another section, another object's kernel, a name
registered with `add_symbol` or a C library function -- is one absolute 64-bit relocation
(R_X86_64_64, S + A). `link` lays their allocated sections out in one anonymous mapping (code,
then read-only data, then writable data, each group on pages of its own), resolves their symbols,
applies the relocations, and makes the code pages executable and the constants read-only. It
refuses (`Unsupported`) anything else -- another machine, another relocation type, common
symbols -- and runtime/native.py then links with llvmlite's MCJIT instead, as it does everywhere
but x86-64 Linux.
"""
from __future__ import annotations

import ctypes
import mmap
import platform
import struct
import weakref
from typing import Sequence

_FILE = struct.Struct("<16sHHIQQQIHHHHHH")  # ELF64 header
_SECTION = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, address, offset, size, link, info,
#                                          alignment, entry size
_SYMBOL = struct.Struct("<IBBHQQ")  # name, info, other, section index, value, size
_RELOCATION = struct.Struct("<QQq")  # offset, info (symbol << 32 | type), addend
_ADDRESS = struct.Struct("<Q")

ELF_MAGIC, ELFCLASS64, ELFDATA2LSB, ET_REL, EM_X86_64 = b"\x7fELF", 2, 1, 1, 62
SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 2, 4, 8, 9
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHN_UNDEF, SHN_LORESERVE, SHN_ABS = 0, 0xFF00, 0xFFF1
STB_LOCAL = 0
R_X86_64_64 = 1
PAGE = mmap.PAGESIZE

# The names compiled code calls into the runtime (the gemm, the thread pool, host callbacks, MPI)
# by address, registered by the modules that provide them (see codegen/symbols.py).
_symbols: dict[str, int] = {}


class Unsupported(RuntimeError):
    """Object code this loader does not link (MCJIT does)."""


def add_symbol(name: str, address: int) -> None:
    """Make `name` resolve to `address` in object code linked from now on."""
    _symbols[name] = address


def registered_symbols() -> dict[str, int]:
    return dict(_symbols)


def supported() -> bool:
    """Whether this process's objects are ones `link` links: x86-64 Linux."""
    return platform.machine() == "x86_64" and platform.system() == "Linux"


_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype, _mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                  ctypes.c_int, ctypes.c_int, ctypes.c_long]
_mprotect = _libc.mprotect
_mprotect.restype, _mprotect.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t,
                                                       ctypes.c_int]
_munmap = _libc.munmap
_munmap.restype, _munmap.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]


class _Object:
    """One relocatable object: its sections, its symbol table, and where each allocated section
    goes in the image (offset from the mapping's start)."""

    def __init__(self, data: bytes):
        header = _FILE.unpack_from(data) if len(data) >= _FILE.size else None
        if (header is None or header[0][:4] != ELF_MAGIC or header[0][4] != ELFCLASS64
                or header[0][5] != ELFDATA2LSB or header[1] != ET_REL or header[2] != EM_X86_64):
            raise Unsupported("not an x86-64 ELF relocatable object")
        self.data = data
        offset, count = header[6], header[12]
        self.sections = [_SECTION.unpack_from(data, offset + i * _SECTION.size)
                         for i in range(count)]
        self.placed: dict[int, int] = {}  # section index -> offset in the image
        self.symbols: list[tuple] = []
        self.names: list[str] = []
        for section in self.sections:
            if section[1] == SHT_SYMTAB:
                strings = self.sections[section[6]]
                self.symbols = [_SYMBOL.unpack_from(data, section[4] + i * _SYMBOL.size)
                                for i in range(section[5] // _SYMBOL.size)]
                self.names = [self._string(strings, symbol[0]) for symbol in self.symbols]
            elif section[1] == SHT_REL:
                raise Unsupported("REL relocations")

    def _string(self, table: tuple, offset: int) -> str:
        start = table[4] + offset
        return self.data[start:self.data.index(b"\0", start)].decode()

    def allocated(self) -> list[tuple[int, tuple]]:
        return [(index, s) for index, s in enumerate(self.sections) if s[2] & SHF_ALLOC]


def _group(section: tuple) -> int:
    """0: code, 1: read-only data, 2: writable data (the order of the groups in the image)."""
    return 0 if section[2] & SHF_EXECINSTR else 2 if section[2] & SHF_WRITE else 1


def _round_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


class LinkedCode:
    """`objects` linked into memory of this process; the memory is released with this object."""

    def __init__(self, objects: Sequence[bytes]):
        parsed = [_Object(data) for data in objects]
        groups = self._lay_out(parsed)
        size = groups[-1][1]
        base = _mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise MemoryError(f"mmap of {size} bytes failed (errno {ctypes.get_errno()})")
        self._finalizer = weakref.finalize(self, _munmap, base, size)
        self._finalizer.atexit = False  # never while the process ends (a pool worker may run)
        self.base = base
        self.exported: dict[str, int] = {}
        for item in parsed:
            for symbol, name in zip(item.symbols, item.names):
                if symbol[1] >> 4 != STB_LOCAL and symbol[3] != SHN_UNDEF:
                    if name in self.exported:
                        raise RuntimeError(f"symbol {name} is defined twice")
                    self.exported[name] = self._value(item, symbol)
        image = bytearray(groups[1][1])  # code and constants (writable data is copied apart)
        for item in parsed:
            self._copy(item, image, base)
        ctypes.memmove(base, bytes(image), len(image))
        protections = (mmap.PROT_READ | mmap.PROT_EXEC, mmap.PROT_READ)
        for (start, end), protection in zip(groups, protections):
            if end > start and _mprotect(base + start, end - start, protection) != 0:
                raise OSError(ctypes.get_errno(), "mprotect of linked code failed")

    @staticmethod
    def _lay_out(parsed: list[_Object]) -> list[tuple[int, int]]:
        """Place every allocated section; the (start, end) offsets of the three groups, each
        starting on a page of its own."""
        position, groups = 0, []
        for group in range(3):
            start = position
            for item in parsed:
                for index, section in item.allocated():
                    if _group(section) == group:
                        position = _round_up(position, max(section[8], 1))
                        item.placed[index] = position
                        position += section[5]
            position = _round_up(position, PAGE)
            groups.append((start, position))
        if position == 0:
            raise Unsupported("no code to link")
        return groups

    def _value(self, item: _Object, symbol: tuple) -> int:
        """The address of a symbol defined in `item`."""
        if symbol[3] == SHN_ABS:
            return symbol[4]
        if symbol[3] >= SHN_LORESERVE or symbol[3] not in item.placed:
            raise Unsupported(f"a symbol in section {symbol[3]:#x}")
        return self.base + item.placed[symbol[3]] + symbol[4]

    def _resolve(self, item: _Object, index: int) -> int:
        symbol, name = item.symbols[index], item.names[index]
        if symbol[3] != SHN_UNDEF:
            return self._value(item, symbol)
        address = self.exported.get(name) or _symbols.get(name)
        if address is None:
            function = getattr(_libc, name, None)  # the C library and the rest of the process
            address = ctypes.cast(function, ctypes.c_void_p).value if function else None
        if not address:
            raise RuntimeError(f"compiled code calls {name}, which is not in this process")
        return address

    def _copy(self, item: _Object, image: bytearray, base: int) -> None:
        """Copy `item`'s sections into the image (or, writable data, into the mapping) and apply
        its relocations."""
        writable = {}
        for index, section in item.allocated():
            if section[1] == SHT_NOBITS:
                continue  # zeros: the mapping's own
            contents = item.data[section[4]:section[4] + section[5]]
            if _group(section) == 2:
                writable[index] = bytearray(contents)
            else:
                start = item.placed[index]
                image[start:start + section[5]] = contents
        for section in item.sections:
            if section[1] != SHT_RELA or section[7] not in item.placed:
                continue
            target = item.placed[section[7]]
            for number in range(section[5] // _RELOCATION.size):
                offset, info, addend = _RELOCATION.unpack_from(
                    item.data, section[4] + number * _RELOCATION.size)
                if info & 0xFFFFFFFF != R_X86_64_64:
                    raise Unsupported(f"relocation type {info & 0xFFFFFFFF}")
                value = (self._resolve(item, info >> 32) + addend) & 0xFFFFFFFFFFFFFFFF
                if section[7] in writable:
                    _ADDRESS.pack_into(writable[section[7]], offset, value)
                else:
                    _ADDRESS.pack_into(image, target + offset, value)
        for index, contents in writable.items():
            ctypes.memmove(base + item.placed[index], bytes(contents), len(contents))

    def address(self, name: str) -> int:
        """The address of the exported function or global `name`; RuntimeError if none."""
        address = self.exported.get(name)
        if not address:
            raise RuntimeError(f"the linked code has no symbol {name}")
        return address

    global_address = address  # (functions and data alike)
