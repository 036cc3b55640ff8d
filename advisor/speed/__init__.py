"""speed layer"""
