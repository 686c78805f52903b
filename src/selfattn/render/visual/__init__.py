"""Pictures of attention: matplotlib plots and a self-contained HTML explorer.

Renderers only: they read a record (or the explorer's data made from one) and never
compute attention themselves.
"""

# Kept here, free of heavy imports, so the CLI can list them before loading torch.
PLOT_KINDS = ("heatmap", "arrows", "heads", "mask", "positional", "rope-distance", "training")
