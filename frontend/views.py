from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from carousel import selectors
from carousel.models import Control


@login_required
def home(request):
    return render(request, "frontend/home.html", {"summary": selectors.queue_summary(user=request.user),
                                                  "control": Control.get()})
