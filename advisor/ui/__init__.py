"""ui layer"""
