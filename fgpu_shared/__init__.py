"""What the spawner, the image catalog, the queue service and the admin command share: sizes and units, the Docker engine client set up from the environment, and the site registry's credentials."""
