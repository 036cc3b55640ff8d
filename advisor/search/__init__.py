"""search layer"""
