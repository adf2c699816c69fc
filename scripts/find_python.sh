# Sourced by the scripts that need a CPython of one minor version (wheel_matrix.sh,
# vllm_env.sh):
#
#   find_python 3.12 [CANDIDATE...]   prints the path of a working CPython 3.12 with venv,
#                                     trying the candidates first, then python3.12 on PATH,
#                                     pyenv's versions/3.12*, /usr/bin/python3.12; returns 1
#                                     when none is found
find_python() {
  local version=$1 cand
  shift
  for cand in "$@" "python$version" "$(pyenv root 2>/dev/null)"/versions/"$version"*/bin/python"$version" \
              /root/.pyenv/versions/"$version"*/bin/python"$version" /usr/bin/python"$version"; do
    [[ -n "$cand" ]] || continue
    # A pyenv shim of a version that is not selected is on PATH but fails to run: skipped.
    if "$cand" -c "import sys, venv; assert '%d.%d' % sys.version_info[:2] == '$version'" \
        2>/dev/null; then
      command -v "$cand" || echo "$cand"
      return 0
    fi
  done
  return 1
}
