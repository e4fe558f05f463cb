# Image for docker-compose.yml (not built on these machines: no Docker engine runs here).
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
# Static files in the image, outside var/ (a volume in docker-compose.yml that outlives upgrades).
ENV CAROUSEL_STATIC_ROOT=/app/static
RUN SECRET_KEY=build CAROUSEL_VAR_DIR=/tmp/build-var python manage.py collectstatic --noinput
EXPOSE 8000
