# Installed as /etc/profile.d/fgpu-venv.sh. A web terminal runs `bash -l`, and Debian's /etc/profile
# sets PATH afresh (dropping the image's /opt/venv/bin), then reads this folder: put the image's
# environment first again, so that python, pip, jupyter and tensorboard in a terminal are the ones
# the notebooks use, in every image built on the base.
case ":${PATH}:" in
  *:/opt/venv/bin:*) ;;
  *) PATH="/opt/venv/bin:${PATH}" ;;
esac
export PATH
