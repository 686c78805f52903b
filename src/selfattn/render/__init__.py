"""The renderers: what a command writes, from the records it is handed.

``text/`` writes text, markdown and JSON (the walkthroughs and every command's report);
``visual/`` draws figures with matplotlib and writes the explorer and live pages. Neither
loads a model, runs training or computes attention: they read the records (``trace/``)
and the analyses' results, and write.
"""
