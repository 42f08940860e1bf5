"""Where the Triton tests run: on the GPU when there is one, else under the Triton interpreter.

tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported when there is no GPU (Triton
fixes the mode at import). Test modules do `from tests.triton_mode import DEVICE, ON_GPU, pytestmark`.
"""

from __future__ import annotations

import pytest
import torch

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# Interpreter runs are marked `interpreter` (they do run on CPU); GPU runs are marked `gpu`.
pytestmark = [pytest.mark.gpu] if ON_GPU else [pytest.mark.interpreter]
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: bf16/fp16 and large shapes "
                               "(the CPU interpreter is fp32-only and slow)")
