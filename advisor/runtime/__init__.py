"""runtime layer"""
