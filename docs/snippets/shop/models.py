from django.db import models


class Booking(models.Model):
    order_id = models.IntegerField()
    created = models.DateTimeField(auto_now_add=True)
