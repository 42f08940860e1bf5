"""Where the Triton tests run: on the GPU when there is one, else under the Triton interpreter;
and nowhere when triton is not installed (a Mac), where they skip with the reason.

tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported when there is no GPU (Triton
fixes the mode at import). Test modules whose every test needs Triton do
`from tests.triton_mode import DEVICE, ON_GPU, pytestmark`; a module mixing Triton and PyTorch tests
takes `where_marks as pytestmark` and marks its Triton tests `needs_triton`. A module that imports
something importing triton at its own top calls `pytest.importorskip("triton", reason=NO_TRITON)`
first, so that collection does not fail.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# find_spec, not an import: importing triton here would cost every test module a second
HAS_TRITON = importlib.util.find_spec("triton") is not None
NO_TRITON = ("needs the triton package, which is not installed (pip install triton; Triton ships wheels "
             "for Linux): the Triton kernels cannot run here")
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
# Interpreter runs are marked `interpreter` (they do run on CPU); GPU runs are marked `gpu`.
where_marks = [pytest.mark.gpu] if ON_GPU else [pytest.mark.interpreter]
pytestmark = [*where_marks, needs_triton]
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: the compiled kernels, bf16 and large "
                               "shapes (the CPU interpreter is slow and refuses bf16)")
