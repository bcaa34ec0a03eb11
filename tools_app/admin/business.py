from django.contrib import admin

from tools_app.models import Order, Ticket

admin.site.register(Order)
admin.site.register(Ticket)
