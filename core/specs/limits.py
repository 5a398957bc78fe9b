"""What reading one commit's specs may cost (the loader's bounds; plnt's settings carry them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SpecLimits(BaseModel):
    """What reading one commit's specs may cost: hostile YAML gets a FILE:LINE problem, not a frozen
    or exhausted plnt. Aliases may expand a file to `alias_factor` nodes per byte (plus 10,000)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_file_bytes: int = Field(default=2**20, gt=0, description="size of one spec file")
    max_files: int = Field(default=10_000, gt=0, description="spec files under the spec path")
    max_total_bytes: int = Field(default=32 * 2**20, gt=0, description="all spec files together")
    max_depth: int = Field(default=64, gt=0, description="nesting of mappings and lists")
    alias_factor: int = Field(default=10, gt=0, description="nodes built per byte of a file, aliases expanded")
    max_nodes: int = Field(default=2_000_000, gt=0, description="nodes built for all files, aliases expanded")
