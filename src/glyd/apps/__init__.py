"""Applications over the library: the end-to-end evaluation (``glyd eval``), the memory planner
(``glyd fit``), the demo (``glyd demo``) and its embedded default model (SmolLM2), the kernel bench
(``glyd bench``), and the command-line front ends of every area (``glyd.cli`` wires them)."""
