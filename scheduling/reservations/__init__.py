"""Reservations: GPUs booked for a window of time, from the request to their end."""
