"""The shared store: SQLAlchemy models, engine setup and every query."""
