"""JupyterLab as users use it: a real server, the system's Chromium, a notebook run from the
Run menu, the torus heatmap and the explorer widget rendered, and the explorer answering a
selection made in its dropdown."""

import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest
from browser import require_chromium
from lab import DevTools, jupyter_lab

DATA = Path(__file__).parent / "data"

# JavaScript over the page: the notebook's plot titles, and its dropdowns.
TITLES = "[...document.querySelectorAll('.jp-Notebook .gtitle')].map(e => e.textContent)"
FAILED = ("(e => e && 'a cell failed: ' + e.textContent)(document.querySelector("
          "'[data-mime-type=\"application/vnd.jupyter.error\"]'))")
SCROLL_TO = ("(y => document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer')"
             ".scrollTo(0, y))")
SELECTS = "[...document.querySelectorAll('.jp-OutputArea-output .widget-dropdown select')]"


# JupyterLab asks which kernel to start when a notebook opens without a session (when that
# dialog shows depends on timing): accept it, as a user would, while waiting for anything.
ACCEPT_DIALOG = "document.querySelector('.jp-Dialog .jp-mod-accept')?.click()"


def _menu_item(label, kind):
    return (f"[...document.querySelectorAll('.lm-{kind}-item')]"
            f".find(e => e.textContent.trim().startsWith({label!r}))")


def _wait_for_kernel(page, base, token, timeout_s=120):
    """Until the server has the notebook's kernel idle and no dialog is up."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        page.evaluate(ACCEPT_DIALOG)
        with urllib.request.urlopen(f"{base}/api/sessions?token={token}") as reply:
            sessions = json.loads(reply.read())
        if (any(s["kernel"]["execution_state"] == "idle" for s in sessions)
                and not page.evaluate("document.querySelector('.jp-Dialog') !== null")):
            return
        time.sleep(0.5)
    raise TimeoutError(f"no idle kernel within {timeout_s} s")


@pytest.mark.slow
def test_the_explorer_notebook_runs_renders_and_answers_a_selection_in_jupyterlab(tmp_path):
    require_chromium()
    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copy(DATA / "explorer.ipynb", folder / "explorer.ipynb")
    with jupyter_lab(folder, tmp_path) as (base, token):
        page = DevTools(f"{base}/lab/tree/explorer.ipynb?token={token}", tmp_path)
        try:
            page.wait_for("document.querySelector('.jp-Notebook .jp-Cell') !== null",
                          what="the notebook open in JupyterLab")
            _wait_for_kernel(page, base, token)
            page.click(_menu_item("Run", "MenuBar"))
            page.wait_for(f"{_menu_item('Run All Cells', 'Menu')} !== undefined")
            page.click(_menu_item("Run All Cells", "Menu"))
            # JupyterLab draws only the cells in view: scroll as a reader would.
            titles = page.wait_for(f"({ACCEPT_DIALOG}, {SCROLL_TO}(1e9), {FAILED} || "
                                   "(t => t.includes('explorer — cfg2-uly4 / compact / "
                                   f"all-to-all') && t)({TITLES}))", timeout_s=180,
                                   what="the explorer drawn")
            assert isinstance(titles, list), titles  # else: the failed cell's traceback
            assert page.evaluate(f"{SELECTS}.map(s => s.value)") == [
                "cfg2-uly4", "compact", "all-to-all"]
            # A selection the way a browser makes one: the <select> changes, 'change' fires.
            page.evaluate(f"(s => {{ s.value = 'ring8'; s.dispatchEvent(new Event('change',"
                          f" {{bubbles: true}})); }})({SELECTS}[0])")
            page.wait_for(f"{TITLES}.includes('explorer — ring8 / compact / all-to-all')",
                          timeout_s=60, what="the explorer redrawn for the new selection")
            assert page.evaluate(f"{SELECTS}.map(s => s.value)") == [
                "ring8", "compact", "all-to-all"]
            titles = page.wait_for(f"({SCROLL_TO}(0), (t => t.includes('heatmap in the lab')"
                                   f" && t)({TITLES}))", timeout_s=60,
                                   what="the heatmap of the first cell drawn")
        except Exception:
            page.screenshot(tmp_path / "jupyterlab.png")  # kept with the test's tmp folder
            raise
        finally:
            page.close()
