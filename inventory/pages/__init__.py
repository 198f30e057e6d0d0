"""What the inventory pages show, apart from HTTP, by subject: ``fleet`` (the dashboard's GPU
rows and summary), ``mig`` (slice layouts and room per profile), ``topology`` (the ``topo -m``
matrix), and ``common`` (units and names). The views in ``inventory.views`` only fetch rows,
call these and render.
"""
