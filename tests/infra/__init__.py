"""Tests of infra/: deployment files checked without the systems they deploy to."""
