"""Domain errors. Each carries what a person needs to act on it; the API and the web form
turn them into responses, so the words are written once."""


class CarouselError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, detail, *, errors=None):
        super().__init__(detail)
        self.detail = detail
        self.errors = errors or []


class InvalidSubmission(CarouselError):
    code = "invalid_submission"


class QueueCeilingReached(CarouselError):
    status = 429
    code = "queue_ceiling_reached"


class NotFound(CarouselError):
    status = 404
    code = "not_found"


class NotAllowed(CarouselError):
    status = 403
    code = "permission_denied"
