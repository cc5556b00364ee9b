"""Graders behind the book's "check your answer" cells.

Each chapter's graders live in their own module (`inflight.exercises.scheduling`, ...); they all use
the shared machinery in `inflight.exercises.grading`.
"""
from inflight.exercises.grading import Case, GradeResult, Mistake, grade, use_if_passed

__all__ = ["Case", "GradeResult", "Mistake", "grade", "use_if_passed"]
