"""Copies csrc/ and profiles/ into the wheel (chord/_data) so a non-editable install can JIT."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        root = Path(__file__).resolve().parent
        for name in ("csrc", "profiles"):
            dst = Path(self.build_lib, "chord", "_data", name)
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(root / name, dst)


setup(cmdclass={"build_py": BuildPyWithData})
