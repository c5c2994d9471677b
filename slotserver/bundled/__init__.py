"""The lab's bundled kernels and layouts in an installed wheel (the source tree keeps them at the
top, in kernels/ and layouts/; pyproject.toml maps them here). `slotserver.runtime.loader.default_dir`
reads a checkout's folders when there is one, else these."""
