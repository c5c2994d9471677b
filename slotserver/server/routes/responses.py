"""Placeholder: filled in by the issue-35 work (routes of the responses API)."""

from __future__ import annotations

ROUTES: list = []
