"""The two kernels in Gluon (Triton's lower-level dialect), warp-specialised for Hopper, and their
launchers: the forward (`flash_fwd_ws_kernel`, `fwd_ws`) and the one-pass backward
(`flash_bwd_ws_kernel`, `onepass_ws`). Written against Triton 3.6's Gluon API."""
