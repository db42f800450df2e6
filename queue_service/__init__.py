"""The `queue` service: owns the queue, every allocation and the accounting (see docs/source/explanation/architecture.md).

A skeleton for now; the service arrives with the queue issue. It never imports `fgpu_spawner`.
"""
