"""Live hints to the console's pages, and the websocket that carries them."""
