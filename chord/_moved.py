"""The lab's earlier import paths, kept for one release: ``chord.bench`` is ``chord.lab.bench``.

``import chord.bench.suite`` (or ``from chord.workbench import figures``, ``import chord.tune``,
...) gives the very module object of the new path, ``chord.lab.bench.suite``, and warns once per
old name with a DeprecationWarning that names the new path. A finder on ``sys.meta_path``
(installed by ``import chord``) answers only the names in :data:`MOVED` and their submodules; it
imports nothing until such a name is imported, so the core still never loads the lab by itself.
``python -m <old name>`` runs the new module too.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module -> new module; submodules follow their package
MOVED = {f"chord.{name}": f"chord.lab.{name}"
         for name in ("bench", "workbench", "tune", "capture", "limits", "timeline", "doctor")}


def new_name(fullname: str) -> str | None:
    """The new path of an old module name (None for any other name)."""
    for old, new in MOVED.items():
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old):]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def _warn(self) -> None:
        # stacklevel 3: past this method and create_module / get_code; warnings skips the import
        # machinery's own frames, so the warning points at the user's import statement
        warnings.warn(f"{self.old} is deprecated and will be removed in the next release; import {self.new} "
                      "(the same module)", DeprecationWarning, stacklevel=3)

    def create_module(self, spec):
        self._warn()
        return importlib.import_module(self.new)  # the import system keeps it as is, under the old name too

    def exec_module(self, module) -> None:
        pass  # already executed under its new name

    def is_package(self, fullname: str) -> bool:
        spec = importlib.util.find_spec(self.new)
        return spec is not None and spec.submodule_search_locations is not None

    def get_code(self, fullname: str):  # python -m <old name>
        self._warn()
        return importlib.util.find_spec(self.new).loader.get_code(self.new)


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        target_spec = importlib.util.find_spec(new)
        if target_spec is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(fullname, new),
                                               is_package=target_spec.submodule_search_locations is not None)


FINDER = _MovedFinder()


def install() -> None:
    """Puts the finder first on sys.meta_path (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, FINDER)
