"""vram-advisor: find the best way to fine-tune (and serve) an LLM on the GPU memory you have.

Importing this package is cheap: nothing here imports torch. Heavy libraries are imported
inside the functions that need them (see ``advisor.runtime.backends``).
"""

__version__ = "0.1.0"
