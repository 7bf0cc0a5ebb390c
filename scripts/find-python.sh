# Sourced by the wheel scripts: find_python 3.X prints the path of pyenv's
# CPython 3.X, else of python3.X on PATH, and fails when neither exists.
find_python() {
  local v=$1 root p
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for p in "$root"/versions/"$v".*/bin/python"$v"; do
    if [ -x "$p" ]; then echo "$p"; return 0; fi
  done
  p=$(command -v "python$v" 2>/dev/null) && [ -x "$p" ] && { echo "$p"; return 0; }
  return 1
}
