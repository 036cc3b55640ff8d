"""diagnosis layer"""
