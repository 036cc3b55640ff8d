"""memory layer"""
