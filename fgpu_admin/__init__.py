"""The admin's command line, ``fgpu-hub``: back up, restore, check and install the hub as a service.

It runs beside the hub, in its state directory, and imports the service and the catalog; nothing
in the hub imports it.
"""
