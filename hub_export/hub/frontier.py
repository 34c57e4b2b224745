"""The card's plot of each variant's download size against its quality (perplexity relative to fp32)."""

from __future__ import annotations

from hub_export.pipeline.manifest import Manifest

FRONTIER_PLOT = "frontier.png"


def frontier_points(manifest: Manifest) -> list[tuple[str, float, float]]:
    """``(file, size in MB, perplexity / fp32's)`` of every variant with quality figures."""
    points = []
    for variant in manifest.variants:
        quality = variant.verification.quality
        if quality is not None and quality.ratio is not None:
            points.append((variant.file, variant.total_bytes / 1e6, quality.ratio))
    return points


def frontier_png(manifest: Manifest) -> bytes | None:
    """A small plot of size against perplexity when more than two variants have figures, else None."""
    import io

    points = frontier_points(manifest)
    if len(points) <= 2:
        return None
    from matplotlib.figure import Figure  # the object API: no global pyplot state, no display needed

    figure = Figure(figsize=(6.4, 4.0), dpi=100)
    axes = figure.subplots()
    axes.scatter([size for _, size, _ in points], [ratio for *_, ratio in points], color="#d9480f")
    for file, size, ratio in points:
        axes.annotate(
            file.removeprefix("model-").removesuffix(".pte"),
            (size, ratio),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=8,
        )
    axes.axhline(1.0, color="#868e96", linewidth=0.8, linestyle="--")
    axes.set_xlabel("download size (MB)")
    axes.set_ylabel("perplexity / fp32's (lower is better)")
    axes.set_title(f"{manifest.source.get('id', '')}: size against quality", fontsize=10)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})  # same figures, same bytes
    return buffer.getvalue()


__all__ = ["FRONTIER_PLOT", "frontier_points", "frontier_png"]
