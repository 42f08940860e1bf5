"""A/B experiments behind the fast kernels' design, each a registered benchmark timing versions
round-robin in one process: `ab_dkdv` (versions of the dK/dV kernel), `ab_onepass` (the one-pass
kernel's ablations), `reduce_probe` (its dQ adds alone), `ab_onepass_ws` (the Gluon backward's
variants and ablations). `harness` holds what they share."""
