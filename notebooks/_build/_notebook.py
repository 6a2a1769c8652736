"""What every notebook generator in this folder shares: collect markdown and code cells, write
the notebook (Python 3 kernel metadata) under notebooks/. The generators import it by name
(their own folder is on sys.path when run as scripts)."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parents[1]


class Notebook:
    """Cells in order; ``md(text)`` and ``code(text)`` append one, ``write(name)`` saves them."""

    def __init__(self):
        self.cells: list = []

    def md(self, text: str) -> None:
        self.cells.append(new_markdown_cell(text.strip("\n")))

    def code(self, text: str) -> None:
        self.cells.append(new_code_cell(text.strip("\n")))

    def write(self, name: str) -> Path:
        """Write ``notebooks/<name>`` (a path relative to notebooks/, e.g. "exercises/x.ipynb")."""
        nb = new_notebook(cells=self.cells)
        nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
        nb.metadata["language_info"] = {"name": "python"}
        path = NOTEBOOKS / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        print(f"wrote {path}")
        return path
